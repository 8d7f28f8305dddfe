"""An evaluation's feature pass (``ropim.train.downstream.frozen_scores``: kNN over the train and val splits) with its
images decoded in the evaluating process against in ``--processes`` DataLoader processes (the job's
``--dataloader_workers``), on ImageNet-sized JPEGs at 224²: ``--synthetic N`` photo-like 500×375 JPEGs (quality 90)
as Parquet shards, or ``--data`` (any source). The encoder is ViT-T/16 without its blocks, on one torch thread, so
that decoding weighs as it does beside a GPU's forward; the encoder-only seconds are reported beside. Runs alternate
(in-process, processes, in-process, …); the median of ``--repeats`` is reported, and the scores of both must be
equal.

    PYTHONPATH=. python bench/eval_decode.py [--synthetic 2000] [--processes 2] [--repeats 2]

Table on stdout; JSON in ``bench/results/eval_decode.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
from data_throughput import synthetic_parquet  # bench/, beside this file
from record import provenance, write_json

from ropim.data.config import DataConfig
from ropim.data.datasets import eval_splits
from ropim.train.downstream import frozen_scores

RESULTS = Path(__file__).resolve().parent / "results"


def encoder() -> torch.nn.Module:
    """ViT-T/16's patch embedding and pooling at 224² (no block), seeded: a light forward beside the decode."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", depth=0, num_classes=0).eval()


def timed(data: DataConfig, processes: int) -> tuple[dict, float]:
    """(scores, seconds) of one kNN evaluation pass."""
    t0 = time.perf_counter()
    found = frozen_scores(encoder(), 224, data, knn_k=20, linear=False, processes=processes)
    return found, time.perf_counter() - t0


@torch.no_grad()
def encoder_seconds(images: int, batch: int = 256) -> float:
    """Seconds the encoder alone takes over ``images`` images (random pixels): the pass's floor."""
    model, t0 = encoder(), time.perf_counter()
    for start in range(0, images, batch):
        model(torch.randn(min(batch, images - start), 3, 224, 224))
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a data source; default: --synthetic JPEGs")
    p.add_argument("--synthetic", type=int, default=2000, help="JPEGs to make when --data is not given")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "eval_decode.json")
    args = p.parse_args(argv)
    if args.processes < 1 or args.repeats < 1:
        sys.exit("eval_decode: --processes and --repeats must be at least 1")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="eval-decode-") as scratch:
        data = DataConfig(source=args.data or synthetic_parquet(args.synthetic, Path(scratch)))
        images = sum(len(split) for split in eval_splits(data, 224))
        runs: dict[int, list[float]] = {0: [], args.processes: []}
        scores: dict[int, dict] = {}
        for _ in range(args.repeats):
            for processes in runs:
                scores[processes], seconds = timed(data, processes)
                runs[processes].append(seconds)
    floor = encoder_seconds(images)
    seconds = {k: statistics.median(v) for k, v in runs.items()}
    rows = [("in the evaluating process", 0), (f"{args.processes} DataLoader processes", args.processes)]
    print(f"{'decoded':<28}{'seconds':>9}{'img/s':>9}  scores ({images} images, 224², 1 torch thread)")
    for label, k in rows:
        print(f"{label:<28}{seconds[k]:>9.1f}{images / seconds[k]:>9.0f}  {scores[k]}")
    print(f"{'(encoder alone)':<28}{floor:>9.1f}{images / floor:>9.0f}")
    print(f"speed-up: {seconds[0] / seconds[args.processes]:.2f}x; scores equal: {scores[0] == scores[args.processes]}")
    report = {"data": args.data or f"synthetic: {args.synthetic} JPEGs 500x375 q90", "images": images,
              "processes": args.processes, "seconds": {str(k): v for k, v in runs.items()},
              "median_seconds": {str(k): v for k, v in seconds.items()}, "encoder_only_seconds": floor,
              "speedup": seconds[0] / seconds[args.processes], "scores": {str(k): v for k, v in scores.items()},
              "scores_equal": scores[0] == scores[args.processes], **provenance("bench/eval_decode.py", argv, t0)}
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
