"""An evaluation beside training (rank 0 alone, as ``eval_async`` runs it) over the whole train split as the kNN bank
and probe set, against ``--eval_train_images N``'s seeded sample of it (``frozen_scores(train_images=N)``). The
encoder is ``cifar_micro``'s shape at random initialisation, on one thread (``bench/knn_split.py``'s). The two run one
after the other; the table gives each one's seconds and scores, and the ratio.

    PYTHONPATH=. python bench/eval_sample.py --data PATH/TO/cifar10-parquet [--train-images 5000] [--linear]

Table on stdout; JSON in ``bench/results/eval_sample.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from knn_split import scores  # bench/, beside this file
from record import provenance, side_by_side, write_json


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("ROPIM_BENCH_DATA"), help="a data source (or ROPIM_BENCH_DATA)")
    p.add_argument("--train-images", type=int, default=5000, help="the sample's size")
    p.add_argument("--linear", action="store_true", help="also the linear probe (fitted on the bank)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "eval_sample.json")
    args = p.parse_args(argv)
    if not args.data:
        sys.exit("eval_sample: give --data (a CIFAR-10 Parquet folder, an ImageFolder, or digits)")
    t0 = time.perf_counter()
    whole, whole_s = scores(args.data, args.linear)
    sampled, sampled_s = scores(args.data, args.linear, train_images=args.train_images)
    runs = {"whole": ("whole", whole, whole_s), "sampled": (f"sample of {args.train_images}", sampled, sampled_s)}
    report = {"data": args.data, "train_images": args.train_images, **side_by_side("train split as bank", runs),
              **provenance("bench/eval_sample.py", argv, t0)}
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
