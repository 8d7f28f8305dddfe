"""What a worker saves by starting from the driver's listing of an ImageFolder (``one_listing``) instead of walking
the tree itself: the walk (``open_source``, cold and warm page cache as the machine allows) against the pickled
listing's size and the time to unpickle it (what ``ray.get`` of the driver's Ray object costs a worker beyond copying
its bytes). The tree is made of empty files (a walk reads names, not images) in a scratch folder, or given.

    PYTHONPATH=. python bench/listing_share.py --files 200000
    PYTHONPATH=. python bench/listing_share.py --folder /data/imagenet1k/train    # a real tree, read only

Table on stdout; JSON in ``bench/results/listing_share.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

from record import provenance, write_json  # bench/, beside this file

from ropim.data.config import DataConfig
from ropim.data.sources import open_source

RESULTS = Path(__file__).resolve().parent / "results"


def make_tree(root: Path, files: int, classes: int) -> None:
    """ROOT/<class>/<i>.jpg, ``files`` empty files over ``classes`` class folders."""
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(c, files, classes):
            (folder / f"{i:08d}.jpg").touch()


def timed(fn, repeats: int) -> tuple[float, object]:
    """(the best of ``repeats`` wall times of ``fn()``, its last result)."""
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def measure(folder: Path, repeats: int) -> dict:
    cfg = DataConfig(source=str(folder))
    walk_s, source = timed(lambda: open_source(cfg), repeats)
    listed = {(cfg.resolved(), 32): source}
    dump_s, blob = timed(lambda: pickle.dumps(listed, protocol=5), repeats)
    load_s, _ = timed(lambda: pickle.loads(blob), repeats)
    n = sum(len(source.split(s)) for s in ("train", "val"))
    return dict(images=n, walk_s=walk_s, pickled_mib=len(blob) / 2**20, pickle_s=dump_s, unpickle_s=load_s,
                walk_over_unpickle=walk_s / load_s)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=200_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--folder", type=Path, help="a real ImageFolder tree to measure instead (only read)")
    p.add_argument("--repeats", type=int, default=3, help="best of this many (the first walk may be cold)")
    p.add_argument("--out", type=Path, default=RESULTS / "listing_share.json")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ropim-listing-") as scratch:
        folder = args.folder
        if folder is None:
            folder = Path(scratch) / "tree"
            make_tree(folder, args.files, args.classes)
        report = {"folder": "scratch tree of empty files" if args.folder is None else str(folder),
                  **measure(folder, args.repeats)}
    report.update(provenance("bench/listing_share.py", argv, t0))
    for k, v in report.items():
        print(f"{k:20s} {v:.3f}" if isinstance(v, float) else f"{k:20s} {v}")
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
