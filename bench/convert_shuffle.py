"""What ``ropim data convert`` of a Parquet source written in class order costs and gives, in its source order
(``--shuffle false``, what convert did with any Parquet source before) and shuffled through staging
(``ropim.data.staging``): seconds, how much the converting process's memory grew while it converted (sampled every
5 ms), and how mixed the shards come out (the median share of the classes a shard of its size could hold, the
measure of ``ropim.data.blocks.mixing_note``).

The source is a class-ordered copy of ``--data`` (Parquet shards with ``image`` / ``label``; CIFAR-10's training
split: its 50,000 images in 10 shards, one class each), written first into ``--work``. Each conversion runs in a
process of its own, one after the other: in the source's order, shuffled in rounds of ``--round-mib``, and shuffled
in one round (the whole split's bytes held at once)::

    PYTHONPATH=. python bench/convert_shuffle.py --data PATH/TO/cifar10-parquet --round-mib 16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from record import provenance, write_json

CONVERT = """
import json, sys, threading, time
import psutil
from ropim.data import staging
from ropim.data.config import DataConfig
from ropim.data.convert import convert
staging.ROUND_BYTES = int(sys.argv[4])
me, peak, done = psutil.Process(), [0], threading.Event()
def sample():
    while not done.wait(0.005):
        peak[0] = max(peak[0], me.memory_info().rss)
before = me.memory_info().rss
threading.Thread(target=sample, daemon=True).start()
t0 = time.perf_counter()
report = convert(DataConfig(sys.argv[1]), sys.argv[2], 1000, shuffle=sys.argv[3] == "1", progress=False)
seconds = time.perf_counter() - t0
done.set()
print(json.dumps({"seconds": seconds, "images": report.images, "rss_before_mib": before / 2**20,
                  "rss_growth_mib": (max(peak[0], before) - before) / 2**20}))
"""

def class_ordered(data: Path, out: Path) -> int:
    """Write ``data``'s train shards again, one class a shard (its classes metadata kept); the image count."""
    files = sorted(data.glob("train-*.parquet"))
    table = pa.concat_tables(pq.read_table(f, columns=["image", "label"]) for f in files)
    meta = pq.read_schema(files[0]).metadata
    table = table.take(pc.sort_indices(table["label"]))
    out.mkdir(parents=True)
    for k, label in enumerate(np.unique(table["label"].to_numpy())):
        part = table.filter(pc.equal(table["label"], label)).replace_schema_metadata(meta)
        pq.write_table(part, out / f"train-{k:05d}.parquet")
    return table.num_rows


def mixing(dst: Path) -> float:
    """The median share of the classes a shard of ``dst`` holds, of those a shard of its size could hold."""
    classes = len(json.loads((dst / "classes.json").read_text()))
    shares = []
    for f in sorted(dst.glob("train-*.parquet")):
        labels = pq.read_table(f, columns=["label"])["label"].to_numpy()
        shares.append(len(np.unique(labels)) / min(len(labels), classes))
    return float(np.median(shares))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=os.environ.get("ROPIM_BENCH_DATA"),
                        help="Parquet shards with image and label columns (or ROPIM_BENCH_DATA)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--round-mib", type=int, default=1024, help="staging rounds' encoded bytes, at most")
    parser.add_argument("--out", type=Path, default=Path("bench/results/convert_shuffle.json"))
    args = parser.parse_args(argv)
    if args.data is None:
        sys.exit("convert_shuffle: give --data (CIFAR-10's training split as Parquet shards)")
    t0 = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="convert-shuffle-"))
    images = class_ordered(args.data, work / "source")
    runs = {}
    for name, shuffle, round_mib in (("source_order", "0", args.round_mib), ("shuffled", "1", args.round_mib),
                                     ("shuffled_one_round", "1", 1 << 20)):
        dst = work / name
        proc = subprocess.run([sys.executable, "-c", CONVERT, str(work / "source"), str(dst), shuffle,
                               str(round_mib << 20)], capture_output=True, text=True, check=True)
        runs[name] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "mixing": mixing(dst)}
        print(f"{name:<20}{runs[name]['seconds']:>8.1f} s  memory +{runs[name]['rss_growth_mib']:>5.0f} MiB  "
              f"classes a shard holds (median share): {runs[name]['mixing']:.2f}")
    print(f"shuffled / source order: {runs['shuffled']['seconds'] / runs['source_order']['seconds']:.2f}x the time")
    if args.work is None:
        shutil.rmtree(work)
    write_json({"images": images, "round_mib": args.round_mib, **runs,
                **provenance("bench/convert_shuffle.py", argv, t0)}, args.out)


if __name__ == "__main__":
    main()
