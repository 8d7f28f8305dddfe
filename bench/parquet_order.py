"""What one epoch of training on Parquet shards reads and holds in each DataLoader process: torch's
``DistributedSampler`` (a permutation; each process kept every shard it read, as before 2026-11-28) against
``ropim.data.sampling.BlockSampler`` (shards shuffled, images shuffled within windows of 2 shards, each process
reading its own, keeping ``KEPT_FILES``). The order is dealt to ``--processes`` processes as a DataLoader deals its
batches; each process's shard reads and the most image bytes it held at once are counted (no image is decoded).

    PYTHONPATH=. python bench/parquet_order.py --data PATH/TO/parquet-shards [--processes 8] [--batch 190]

Table on stdout; JSON in ``bench/results/parquet_order.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from record import provenance, write_json  # bench/, beside this file
from torch.utils.data import DistributedSampler

from ropim.data.config import DataConfig
from ropim.data.formats.parquet_rows import KEPT_FILES
from ropim.data.sampling import BlockSampler
from ropim.data.sources import open_source

RESULTS = Path(__file__).resolve().parent / "results"


def held(order: list[int], batch: int, processes: int, source, keep: int) -> tuple[int, int]:
    """(shard reads, most bytes one process held) of reading ``order`` in batches dealt to ``processes`` processes,
    each with its own list keeping ``keep`` shards."""
    reads, most = 0, 0
    batches = [order[k:k + batch] for k in range(0, len(order) - batch + 1, batch)]
    for p in range(processes):
        images = source.split("train", cache_files=keep)
        seen = set(images.cache)
        for b in batches[p::processes]:
            for i in b:
                images.load(i)
                if images.cache.keys() != seen:
                    reads += len(images.cache.keys() - seen)
                    seen = set(images.cache)
                    most = max(most, sum(column.nbytes for column in images.cache.values()))
    return reads, most


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("ROPIM_BENCH_DATA"), help="Parquet shards (or ROPIM_BENCH_DATA)")
    p.add_argument("--processes", type=int, default=8)
    p.add_argument("--batch", type=int, default=190)
    p.add_argument("--out", type=Path, default=RESULTS / "parquet_order.json")
    args = p.parse_args(argv)
    if not args.data:
        sys.exit("parquet_order: give --data (a folder of Parquet shards)")
    t0 = time.perf_counter()
    source = open_source(DataConfig(source=args.data))
    images = source.split("train")
    n, files = len(images), len(images.files)
    before = list(DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=0, drop_last=True))
    after = list(BlockSampler(images.blocks(), 1, 0, seed=0, batch=args.batch, processes=args.processes))
    rows = {"before": held(before, args.batch, args.processes, source, files),
            "after": held(after, args.batch, args.processes, source, KEPT_FILES)}
    total = sum(column.nbytes for column in [images.column(f, "image") for f in range(files)])
    print(f"{n} images in {files} shards ({total / 2**20:.1f} MiB of image bytes), {args.processes} processes, "
          f"batch {args.batch}")
    print(f"{'order':<42}{'shard reads':>12}{'MiB held (one process)':>25}")
    for label, key in (("permutation, every shard kept (before)", "before"),
                       (f"BlockSampler, {KEPT_FILES} shards kept (now)", "after")):
        print(f"{label:<42}{rows[key][0]:>12}{rows[key][1] / 2**20:>25.1f}")
    report = {"data": args.data, "images": n, "shards": files, "image_bytes": total, "processes": args.processes,
              "batch": args.batch, **{k: {"shard_reads": r, "most_bytes_held": b} for k, (r, b) in rows.items()},
              **provenance("bench/parquet_order.py", argv, t0)}
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
