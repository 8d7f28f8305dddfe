"""What reading a split's paths costs each DataLoader process: a list of Python strings (the item lists before
2026-11-28) against ``ropim.data.item_paths.ItemPaths`` (one Arrow array). A real torch DataLoader with
``--processes`` forked processes reads every path of a FileList of ``--paths`` ImageNet-like paths (1.28 M:
ImageNet-1k's training split) in shuffled batches; each process reports how much of its memory became its own
(Private_Dirty) from its first batch to its last. No file is opened.

    PYTHONPATH=. python bench/path_memory.py [--paths 1281167] [--processes 4]

Table on stdout; JSON in ``bench/results/path_memory.json`` (``--out``). Linux only (``/proc/self/smaps_rollup``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from record import provenance, write_json  # bench/, beside this file
from torch.utils.data import BatchSampler, DataLoader, Dataset, RandomSampler, get_worker_info

from ropim.data.lists import FileList

RESULTS = Path(__file__).resolve().parent / "results"


def private_dirty_mib() -> float:
    """This process's private dirty memory, MiB."""
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Private_Dirty")) / 1024


class PathBatches(Dataset):
    """A batch of indices → (process, its private dirty MiB after reading the batch's paths, characters read)."""

    def __init__(self, paths) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, batch: list[int]) -> tuple[int, float, int]:
        chars = sum(len(self.paths[i]) for i in batch)
        return get_worker_info().id, private_dirty_mib(), chars


def measure(paths, processes: int, batch: int, seed: int) -> dict:
    """Each process's growth in private memory (MiB) over one shuffled pass, and the pass's seconds."""
    ds = PathBatches(paths)
    sampler = BatchSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(seed)), batch, drop_last=False)
    loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=processes, multiprocessing_context="fork")
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    t0 = time.perf_counter()
    chars = 0
    for worker, mib, n in loader:
        first.setdefault(worker, mib)
        last[worker] = mib
        chars += n
    growth = [round(last[w] - first[w], 1) for w in sorted(first)]
    return {"growth_mib": growth, "seconds": round(time.perf_counter() - t0, 2), "chars": chars}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--paths", type=int, default=1_281_167)
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", type=Path, default=RESULTS / "path_memory.json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    wnids = [f"n{k:08d}" for k in range(1000)]
    listed = [f"train/{wnids[i % 1000]}/{wnids[i % 1000]}_{i}.JPEG" for i in range(args.paths)]
    files = FileList("imagenet", np.arange(args.paths) % 1000, listed, wnids)
    rows = {"list of str": measure(listed, args.processes, args.batch, 0),
            "ItemPaths": measure(files.paths, args.processes, args.batch, 0)}
    assert len({r["chars"] for r in rows.values()}) == 1, "both passes must read the same paths"
    print(f"{args.paths:,} paths, {args.processes} DataLoader processes, batches of {args.batch}")
    print(f"{'paths held as':<14} {'MiB each process made its own':>32} {'s':>6}")
    for name, r in rows.items():
        print(f"{name:<14} {', '.join(f'{g:.1f}' for g in r['growth_mib']):>32} {r['seconds']:>6.1f}")
    report = {"paths": args.paths, "processes": args.processes, "batch": args.batch, "rows": rows,
              **provenance("bench/path_memory.py", argv, t0)}
    write_json(report, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
