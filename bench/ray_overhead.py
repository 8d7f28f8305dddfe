"""Ray Train overhead: steady-state img/s of a 1-worker TorchTrainer vs the same loop in a plain process.

The loop is ROPIM's training step (forward, backward, AdamW) on the CPU-size ViT (ViT-T width, 32², patch 4)
with in-memory batches, so the comparison isolates what Ray adds. The worker gets as many CPUs (and so
OMP threads; Ray sets OMP_NUM_THREADS from the worker's CPU share) as the plain process uses torch threads.
Start-up cost = TorchTrainer.fit() wall time − the loop's own time. Repeats are interleaved.
Target: Ray steady state ≥ 0.95× plain.

    .venv/bin/python bench/ray_overhead.py [--repeats 2] [--steps 30] [--depth 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ray_overhead.json"


def run_loop(config: dict) -> dict:
    """Warm up, then time ``steps`` training steps; returns img/s and the loop's wall time."""
    from timm.optim import create_optimizer_v2

    from ropim.core.config import ModelConfig
    from ropim.core.model import ROPIM

    t_start = time.perf_counter()
    torch.manual_seed(0)
    model = ROPIM(ModelConfig(img_size=32, patch_size=4, depth=config["depth"]))
    opt = create_optimizer_v2(model, "adamw", lr=1e-4, weight_decay=0.05, betas=(0.9, 0.95))
    imgs = torch.randn(config["batch_size"], 3, 32, 32)
    g = torch.Generator().manual_seed(0)

    def step() -> None:
        loss, _, _ = model(imgs, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(config["warmup"]):
        step()
    t0 = time.perf_counter()
    for _ in range(config["steps"]):
        step()
    elapsed = time.perf_counter() - t0
    return {"img_per_s": config["steps"] * config["batch_size"] / elapsed, "loop_s": time.perf_counter() - t_start,
            "threads": torch.get_num_threads()}


def ray_worker(config: dict) -> None:
    import tempfile

    import ray.train

    metrics = run_loop(config)
    with tempfile.TemporaryDirectory() as d:
        Path(d, "m.json").write_text(json.dumps(metrics))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def run_ray(config: dict) -> dict:
    """1-worker TorchTrainer running the loop; metrics reported with a tiny checkpoint so Result.metrics is set."""
    import tempfile

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    with tempfile.TemporaryDirectory() as storage:
        t0 = time.perf_counter()
        result = TorchTrainer(
            ray_worker, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": config["cpus"]}),
            run_config=RunConfig(storage_path=storage, name="overhead"),
        ).fit()
        wall = time.perf_counter() - t0
    return {**result.metrics, "wall_s": wall}


def main() -> None:
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    cpus = os.cpu_count() or 2
    torch.set_num_threads(cpus)
    config = {"steps": args.steps, "warmup": args.warmup, "batch_size": args.batch_size, "depth": args.depth,
              "cpus": cpus}

    t0 = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - t0
    results = {"plain": [], "ray": []}
    for _ in range(args.repeats):
        results["plain"].append(run_loop(config))
        results["ray"].append(run_ray(config))
    ray.shutdown()

    plain = statistics.median(r["img_per_s"] for r in results["plain"])
    ray_rate = statistics.median(r["img_per_s"] for r in results["ray"])
    startup = statistics.median(r["wall_s"] - r["loop_s"] for r in results["ray"])
    ratio = ray_rate / plain
    print(f"ViT-T width, depth {args.depth}, 32², patch 4, batch {args.batch_size}, {cpus} CPU threads, "
          f"{args.steps} timed steps × {args.repeats} interleaved repeats (median)")
    print(f"{'variant':<28}{'img/s':>10}{'× plain':>10}")
    print(f"{'plain process':<28}{plain:>10.1f}{1.0:>10.3f}")
    print(f"{'1-worker TorchTrainer':<28}{ray_rate:>10.1f}{ratio:>10.3f}")
    print(f"ray.init: {init_s:.1f} s; TorchTrainer fixed start-up + teardown per fit: {startup:.1f} s")
    print(f"target: ≥ 0.95× plain -> {'met' if ratio >= 0.95 else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "config": config, "results": results, "plain_img_per_s": plain, "ray_img_per_s": ray_rate,
        "ratio": ratio, "ray_init_s": init_s, "fit_startup_s": startup, "torch": torch.__version__,
        "machine": platform.platform(), "loadavg": os.getloadavg(),
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
