"""What training makes of a split read in blocks (Parquet files), said before it costs: it reads ``WINDOW`` blocks
at a time (``ropim.data.sampling``), so blocks holding few classes each give batches of few classes
(``mixing_note``: the job's first epoch and ``ropim data inspect`` ask it), and each reading process keeps a few
blocks' images, so large blocks read by many processes can fill a node's memory (``holding_note``). No torch."""

from __future__ import annotations

import numpy as np

from ropim.data.formats.parquet_rows import KEPT_FILES

WINDOW = 2  # blocks whose items are shuffled together; a reading process holds two windows at most (KEPT_FILES)
HOLDING_SHARE = 0.25  # of a node's memory: the most the shards its reading processes keep may take, unwarned


RAY_DATA_READING = "Ray Data mixes each batch from a few 500-row pieces of shards"  # ``ropim.data.ingest``


def mixing_note(dataset: object, reading: str = f"training reads {WINDOW} shards at a time") -> str | None:
    """A warning when a labelled split read in blocks (``blocks()``, ``labels``, ``classes``: an ``ImageList`` or a
    dataset of one) holds few of its classes in each (shards written in class order): batches drawn from a window of
    blocks (``BlockSampler``'s, or as ``reading`` says) would hold few classes; else None."""
    blocks, labels = getattr(dataset, "blocks", lambda: None)(), getattr(dataset, "labels", None)
    if blocks is None or labels is None or len(dataset.classes) < 2:
        return None
    spans = [labels[a:b] for a, b in zip(blocks[:-1], blocks[1:], strict=True) if b > a]
    median = float(np.median([len(np.unique(s)) / min(len(s), len(dataset.classes)) for s in spans]))
    if median >= 0.5:
        return None
    return (f"the Parquet shards hold few classes each (median {100 * median:.0f}% of the classes a shard of its size "
            f"could hold): {reading}, so its batches would hold few classes; rewrite "
            "them with `ropim data convert` (it shuffles the images over the shards)")


def holding_note(dataset: object, processes: int, workers_here: int, memory: int) -> str | None:
    """A warning when the processes reading ``dataset`` on a node (``processes`` DataLoader processes for each of
    the ``workers_here`` workers there; the worker itself when 0) would keep ``HOLDING_SHARE`` or more of its
    ``memory`` bytes in Parquet shards' images (and masks: ``ShardRows.kept_bytes`` each; shards too large for so
    many processes); else None."""
    items = getattr(dataset, "images", getattr(dataset, "pairs", None))  # an image or a pair dataset's list
    kept = getattr(items, "kept_bytes", lambda: 0)()
    readers = max(processes, 1) * workers_here
    if kept * readers < HOLDING_SHARE * memory:
        return None
    return (f"each process reading the Parquet shards keeps up to {KEPT_FILES} of them, {kept / 2**30:.1f} GiB of "
            f"images here: {kept * readers / 2**30:.1f} GiB for the {readers} such processes of the {workers_here} "
            f"worker(s) on this node, {100 * kept * readers / memory:.0f}% of its memory; write smaller shards "
            "(`ropim data convert SRC DST --shard-size 1000`) or use fewer --dataloader_workers")
