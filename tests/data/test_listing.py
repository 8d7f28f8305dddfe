"""Listing an ImageFolder and fingerprinting it for `ropim probe --cache_dir`: cheap at ImageNet scale (no stat per
file while listing; stats on threads where each is slow), and the cache key follows every change of the files."""

from __future__ import annotations

import os
import threading
import time

from PIL import Image
from sample_data import pixels

from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset
from ropim.data.sources import open_source


def tree(root, classes: str = "abc", n: int = 60) -> None:
    """``root/<class>/<i>.png`` (and one image in a sub-folder of each class), 8x8 noise."""
    for c, name in enumerate(classes):
        (root / name / "deeper").mkdir(parents=True)
        for i in range(n):
            Image.fromarray(pixels(8, 8, 100 * c + i)).save(root / name / f"{i:03d}.png")
        Image.fromarray(pixels(8, 8, c)).save(root / name / "deeper" / "x.png")


def test_listing_stats_no_file(tmp_path, monkeypatch):
    """Listing 183 images stats none of them but a link and its target (resolving every file's path stat-ed it and
    each of its parent folders: 3.9 s for 200k files, 0.6 s now; ``bench/probe_cache.py``)."""
    root = tmp_path / "pics"
    tree(root)
    (root / "a" / "link.png").symlink_to(root / "a" / "000.png")  # the same real file twice: listed once
    calls = []
    for name in ("stat", "lstat"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, real=real, **k: calls.append(str(a[0])) or real(*a, **k))
    monkeypatch.chdir(tmp_path)
    listed = open_source(DataConfig("pics")).split(None)
    monkeypatch.undo()
    assert {c for c in calls if c.endswith(".png")} <= {str(root / "a" / "link.png"), str(root / "a" / "000.png")}
    assert len(listed) == 183 and listed.paths[:3] == ["a/000.png", "a/001.png", "a/002.png"]
    assert listed.paths[60:62] == ["a/deeper/x.png", "b/000.png"]  # a folder's files, then its sub-folders'
    assert ("a/link.png" in listed.paths) != ("a/000.png" in listed.paths)


def key(cfg: DataConfig) -> tuple[bytes, bytes]:
    """What ``ropim probe`` keys its cache by: each split's fingerprint, from a fresh listing."""
    return tuple(build_dataset(cfg, split).fingerprint() for split in ("train", "val"))


def test_cache_key_follows_added_removed_renamed_and_changed_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree(tmp_path / "pics", n=10)
    cfg = DataConfig("pics")
    seen = [key(cfg)]
    assert key(cfg) == seen[0]  # nothing changed: the same key, so the cache is read

    def changed(step) -> None:
        step(tmp_path / "pics")
        seen.append(key(cfg))
        assert seen[-1] not in seen[:-1], step.__name__

    def added(p):
        Image.fromarray(pixels(8, 8, 7)).save(p / "a" / "new.png")

    def removed(p):
        (p / "b" / "003.png").unlink()

    def renamed(p):
        (p / "c" / "004.png").rename(p / "c" / "zz.png")

    def moved_to_another_class(p):
        (p / "c" / "zz.png").rename(p / "a" / "zz.png")

    def rewritten_in_place(p):  # same path, same size (8x8 noise PNGs of one encoder), a later mtime
        image = p / "a" / "005.png"
        Image.fromarray(pixels(8, 8, 999)).save(image)
        st = image.stat()
        os.utime(image, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))

    def class_added(p):
        (p / "d").mkdir()
        Image.fromarray(pixels(8, 8, 5)).save(p / "d" / "0.png")

    for step in (added, removed, renamed, moved_to_another_class, rewritten_in_place, class_added):
        changed(step)


def test_slow_stats_run_on_threads_and_give_the_same_fingerprint(tmp_path, monkeypatch):
    """Where each stat waits (a network file system: simulated, 0.3 ms), the stat pass runs on threads: the same
    fingerprint, several threads; on a local disk it stays in the caller's thread."""
    tree(tmp_path / "pics", classes="ab", n=300)
    items = open_source(DataConfig(str(tmp_path / "pics"))).split(None)
    threads, real = set(), os.stat

    def stat(path, *a, **k):
        threads.add(threading.get_ident())
        return real(path, *a, **k)

    monkeypatch.setattr(os, "stat", stat)
    local = items.fingerprint()
    assert threads == {threading.get_ident()}

    def slow(path, *a, **k):
        time.sleep(0.0003)
        return stat(path, *a, **k)

    monkeypatch.setattr(os, "stat", slow)
    assert items.fingerprint() == local and len(threads) > 2
