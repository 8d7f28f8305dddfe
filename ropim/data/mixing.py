"""How mixed a split read in blocks (Parquet files) is: training reads ``WINDOW`` blocks at a time
(``ropim.data.sampling``), so blocks holding few classes each give batches of few classes. Numpy only: the job's
first epoch and ``ropim data inspect`` ask it."""

from __future__ import annotations

import numpy as np

WINDOW = 2  # blocks whose items are shuffled together; a reading process holds two windows at most (KEPT_FILES)


def mixing_note(dataset: object) -> str | None:
    """A warning when a labelled split read in blocks (``blocks()``, ``labels``, ``classes``: an ``ImageList`` or a
    dataset of one) holds few of its classes in each (shards written in class order): ``BlockSampler``'s batches,
    drawn from a window of blocks, would hold few classes; else None."""
    blocks, labels = getattr(dataset, "blocks", lambda: None)(), getattr(dataset, "labels", None)
    if blocks is None or labels is None or len(dataset.classes) < 2:
        return None
    spans = [labels[a:b] for a, b in zip(blocks[:-1], blocks[1:], strict=True) if b > a]
    median = float(np.median([len(np.unique(s)) / min(len(s), len(dataset.classes)) for s in spans]))
    if median >= 0.5:
        return None
    return (f"the Parquet shards hold few classes each (median {100 * median:.0f}% of the classes a shard of its size "
            f"could hold): training reads {WINDOW} shards at a time, so its batches would hold few classes; rewrite "
            "them with `ropim data convert` (it shuffles the images over the shards)")
