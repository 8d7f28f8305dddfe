"""ropim.data.item_paths: a split's paths as one Arrow array that forked DataLoader processes share."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
from pathlib import Path

import numpy as np
import pytest

from ropim.data import item_paths
from ropim.data.item_paths import ItemPaths
from ropim.data.lists import FileList
from ropim.data.pair_lists import FileSegList

SMAPS = Path("/proc/self/smaps_rollup")


def test_reads_like_the_list_it_was_made_of(monkeypatch):
    monkeypatch.setattr(item_paths, "CHUNK", 4)  # iterating crosses chunk boundaries
    listed = [f"d/{i}é.png" for i in range(10)]
    paths = ItemPaths(listed)
    assert len(paths) == 10 and paths[3] == "d/3é.png" and paths[-1] == "d/9é.png" and paths[np.int64(2)] == "d/2é.png"
    assert list(paths) == listed and paths == listed and paths != listed[:-1] and paths != [*listed[:-1], "x"]
    assert "d/7é.png" in paths and paths.index("d/7é.png") == 7 and sorted(paths, reverse=True)[0] == "d/9é.png"
    assert paths[np.array([4, 0, 4])] == ["d/4é.png", "d/0é.png", "d/4é.png"]
    assert paths[np.arange(10) % 3 == 0] == ["d/0é.png", "d/3é.png", "d/6é.png", "d/9é.png"]
    assert paths[2:4] == ["d/2é.png", "d/3é.png"] and isinstance(paths[2:4], ItemPaths)
    assert paths[:2] + ["e"] == ["d/0é.png", "d/1é.png", "e"] and ItemPaths(paths) == paths
    assert pickle.loads(pickle.dumps(paths)) == listed and ItemPaths([]) == [] and "10 paths" in repr(paths)
    with pytest.raises(IndexError):
        paths[10]


def test_lists_keep_their_paths_through_subset_and_concat():
    files = FileList("root", [0, 1, 0], ["a.png", "b.png", "c.png"], ["x", "y"])
    part = files.subset(np.array([2, 0]))
    assert part.paths == ["c.png", "a.png"] and part.file(0).endswith("c.png") and part.labels.tolist() == [0, 0]
    both = part.concat(files)
    assert both.paths == ["c.png", "a.png", "a.png", "b.png", "c.png"] and both.labels.tolist() == [0, 0, 0, 1, 0]
    pairs = FileSegList("root", ["i/a.png", "i/b.png"], ["m/a.png", "m/b.png"], 3, False).subset(np.array([1]))
    assert pairs.paths == ["i/b.png"] and pairs.mask_name(0) == "m/b.png"


def growth_reading(paths, order: np.ndarray, conn) -> None:
    """In a forked process: how much memory (KiB) became this process's own while it read ``paths`` in ``order``."""
    gc.disable()  # only the reads may write

    def dirty() -> int:
        return next(int(line.split()[1]) for line in SMAPS.read_text().splitlines() if line.startswith("Private_Dirty"))

    before = dirty()
    chars = sum(len(paths[int(i)]) for i in order)
    conn.send((dirty() - before, chars))


def copied_reading(paths, order: np.ndarray) -> tuple[int, int]:
    """(KiB a forked process made its own reading ``paths`` in ``order``, the characters it read)."""
    ctx = multiprocessing.get_context("fork")
    ours, theirs = ctx.Pipe(duplex=False)
    child = ctx.Process(target=growth_reading, args=(paths, order, theirs))
    child.start()
    found = ours.recv()
    child.join(60)
    return found


@pytest.mark.skipif(not SMAPS.exists(), reason="needs Linux's /proc/self/smaps_rollup")
def test_a_forked_loader_process_reading_every_path_copies_none_of_them():
    """A DataLoader process reading a FileList's 300,000 paths made ~27 MiB its own when they were Python strings
    (each read writes the string's reference count, so every page of them is copied); now it shares them. Measured
    side by side with a list of the same strings, from the same process: the allocator's own writes in the child
    (3-8 MiB, as the heap that earlier tests left happens to be) are no verdict."""
    n = 300_000
    files = FileList("root", np.zeros(n, dtype=np.int64), [f"train/n{i % 1000:08d}/img_{i}.JPEG" for i in range(n)],
                     ["c"])
    strings, order = list(files.paths), np.random.default_rng(0).permutation(n)
    kib, chars = copied_reading(files.paths, order)
    as_strings, _ = copied_reading(strings, order)
    assert chars == sum(len(p) for p in strings)
    assert as_strings > 16 * 1024 and kib < as_strings / 2, f"{kib / 1024:.1f} MiB copied, {as_strings / 1024:.1f} " \
        "MiB as Python strings"
