"""A pretraining's inline kNN evaluation (its last epoch, ``--eval_async false``, every graft evaluation) on one
worker against split over ``--workers`` (``ropim.train.downstream.frozen_scores(worker=…)``): each worker extracts
every world-th image of both splits and the workers join their kNN candidates. The encoder is ``cifar_micro``'s
shape at random initialisation (ViT-T width, 6 blocks, 32² / patch 4); each process runs torch on one thread, as a
Ray Train worker with one CPU does. The two runs go one after the other; the table gives each one's seconds and
scores, and the ratio.

    PYTHONPATH=. python bench/knn_split.py --data PATH/TO/cifar10-parquet [--workers 2] [--linear]

Table on stdout; JSON in ``bench/results/knn_split.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
import torch.multiprocessing as mp
from record import provenance, side_by_side, write_json  # bench/, beside this file

from ropim.data.config import DataConfig
from ropim.train.collectives import gathered, gathered_on_first
from ropim.train.downstream import frozen_scores

RESULTS = Path(__file__).resolve().parent / "results"


class Share:
    """One of ``world`` processes of a gloo group, as ``frozen_scores`` sees a Ray Train worker."""

    device = torch.device("cpu")

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        return gathered(values, self.world, self.device)

    def gather_to_first(self, values: torch.Tensor) -> torch.Tensor | None:
        return gathered_on_first(values, self.rank, self.world, self.device)


def scores(data: str, linear: bool, worker: Share | None = None, train_images: int | None = None) -> tuple[dict, float]:
    """(scores, seconds) of the random encoder on ``data``, on one thread (``train_images``: the bank's sample)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same weights in every process
    encoder = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=6, num_classes=0)
    t0 = time.perf_counter()
    found = frozen_scores(encoder, 32, DataConfig(source=data), knn_k=20, linear=linear, worker=worker,
                          train_images=train_images)
    return found, time.perf_counter() - t0


def one_of_many(rank: int, world: int, init: str, data: str, linear: bool, out) -> None:
    """Rank ``rank`` of the split run: puts (rank, scores, seconds)."""
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        out.put((rank, *scores(data, linear, Share(rank, world))))
    finally:
        torch.distributed.destroy_process_group()


def split(data: str, workers: int, linear: bool) -> tuple[dict, float]:
    """Rank 0's scores and the slowest worker's seconds, ``workers`` processes."""
    ctx, scratch = mp.get_context("spawn"), tempfile.mkdtemp(prefix="knn-split-")
    out = ctx.Queue()
    procs = [ctx.Process(target=one_of_many, args=(r, workers, f"file://{scratch}/rendezvous", data, linear, out))
             for r in range(workers)]
    for p in procs:
        p.start()
    got = {rank: (found, seconds) for rank, found, seconds in (out.get(timeout=3600) for _ in procs)}
    for p in procs:
        p.join()
    return got[0][0], max(seconds for _, seconds in got.values())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("ROPIM_BENCH_DATA"), help="a data source (or ROPIM_BENCH_DATA)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--linear", action="store_true", help="also the linear probe (its features joined on rank 0)")
    p.add_argument("--out", type=Path, default=RESULTS / "knn_split.json")
    args = p.parse_args(argv)
    if not args.data:
        sys.exit("knn_split: give --data (a CIFAR-10 Parquet folder, an ImageFolder, or digits)")
    t0 = time.perf_counter()
    one, one_s = scores(args.data, args.linear)
    many, many_s = split(args.data, args.workers, args.linear)
    report = {"data": args.data, "workers": args.workers,
              **side_by_side("evaluation", {"one_worker": ("one worker", one, one_s),
                                            "split": (f"split over {args.workers} workers", many, many_s)}),
              **provenance("bench/knn_split.py", argv, t0)}
    write_json(report, args.out)
    return report


if __name__ == "__main__":
    main()
