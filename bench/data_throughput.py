"""Images/s decoded + augmented from Parquet: Ray Data (``ropim.ingest``) vs a plain torch DataLoader.

Both read the same shards (``--data`` or ``ROPIM_BENCH_DATA``), decode with ``ropim.data.decode.decode_rgb``
and apply the same ``pretrain_transform`` (RandomResizedCrop 0.67–1 + flip + normalize), on the same number of
cores ``--cpus``:

* ``torch``    — ``build_dataset(cfg, "train", pretrain_transform)`` in a ``DataLoader(num_workers=cpus,
                 shuffle=True)``; the encoded bytes are held in memory by each worker.
* ``ray``      — ``build_ray_dataset(cfg, "train")`` (read_parquet → 500-row blocks → map_batches decode) on a
                 local Ray started with ``num_cpus=cpus``, consumed with ``iter_epoch`` (iter_torch_batches,
                 local shuffle buffer) in the driver.
* ``1 core``   — the same decode + transform in this process, one thread: the per-core cost for reference.

Each pipeline is timed from its first batch to ``--images`` images (start-up, i.e. spawning workers and the
first batch, reported separately). Repeats interleave torch, ray, torch, ray, … and the median is reported.

Then a real pretraining run (``ropim.train.pretrain``, the ``cifar_micro`` preset: ViT-T/4 with 6 blocks at 32²,
2 Ray Train workers with 0.5 CPU each, Ray Data ingest) of ``--pretrain-epochs`` × ``--pretrain-steps`` steps
reports, per epoch, the share of the epoch its workers spent waiting for the next batch (``data_wait_share``,
mean over workers; the first epoch includes the pipeline's start-up) and its img/s. ``--pretrain-steps 0`` skips it.

Sizing a GPU node: the Ray Data rate per CPU core (decode + augment, img/s over ``--cpus``) against the ViT-B
training-step rate of one GPU (``--gpu-img-per-s``; default: the fastest ViT-B ``rop`` row of a
``bench/results/gpu_step_*.json``, else a labelled estimate: ViT-B's step FLOPs counted here at 40% MFU of an H100
SXM) gives the CPU cores one GPU needs. ``--synthetic N`` makes the data: N JPEGs of ImageNet's typical size
(500×375, quality 90) as Parquet shards, for ``--img-size 224``.

Results: a table on stdout and JSON (default ``bench/results/data_throughput.json``). The issue's targets:
ray ≥ 0.8 × torch, and a wait share ≤ 10%. On a shared machine the absolute rates move with the load; the load
average is recorded.

    .venv/bin/python bench/data_throughput.py [--data PATH] [--images 8000] [--repeats 2] [--cpus 2] \
        [--pretrain-steps 100] [--pretrain-epochs 2] [--pretrain-ingest ray_data|torch]
    .venv/bin/python bench/data_throughput.py --synthetic 2000 --img-size 224 --images 1500 --pretrain-steps 0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset, pretrain_transform
from ropim.data.decode import decode_rgb
from ropim.data.sources import open_source

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_OUT = RESULTS / "data_throughput.json"
TARGET = 0.8
WAIT_TARGET = 0.10
ESTIMATE_MFU, ESTIMATE_PEAK = 0.40, 989.4e12  # the estimate without a GPU result: 40% of an H100 SXM's bf16 peak


def synthetic_parquet(n: int, folder: Path) -> str:
    """``n`` photo-like JPEGs (a smooth random field + grain, 500×375, quality 90; 10 classes) converted to Parquet
    shards under ``folder``; returns the shards' folder."""
    import numpy as np
    from PIL import Image

    from ropim.data.convert import convert

    rng = np.random.default_rng(0)
    for i in range(n):
        low = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        field = np.asarray(Image.fromarray(low).resize((500, 375), Image.BICUBIC), dtype=np.int16)
        pixels = np.clip(field + rng.integers(-12, 13, field.shape), 0, 255).astype(np.uint8)
        (folder / "jpeg" / f"c{i % 10}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / "jpeg" / f"c{i % 10}" / f"{i:06d}.jpg", quality=90)
    convert(DataConfig(source=str(folder / "jpeg")), str(folder / "parquet"), shard_size=500, progress=False)
    return str(folder / "parquet")


def vit_b_rate(given: float | None) -> tuple[float, str]:
    """(ViT-B training img/s of one GPU, where it comes from): given, measured (bench/results), or estimated."""
    if given:
        return given, "--gpu-img-per-s"
    rows = [(r["img_per_s"], f"{path.name}: {r['variant']} ({r['backbone']}, batch {r['batch_size']})")
            for path in sorted(RESULTS.glob("gpu_step_*.json")) if not path.name.startswith("gpu_step_cpu")
            for r in json.loads(path.read_text())["rows"] if r["model"] == "vit_b" and r["corruption"] == "rop"]
    if rows:
        return max(rows)
    from torch.utils.flop_counter import FlopCounterMode

    from ropim.core.config import ModelConfig
    from ropim.core.model import ROPIM

    model = ROPIM(ModelConfig(arch="vit_base_patch16_224", backbone="beit"))
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 224, 224), torch.Generator().manual_seed(0))[0].backward()
    flops = counter.get_total_flops()
    return ESTIMATE_MFU * ESTIMATE_PEAK / flops, (
        f"ESTIMATE, no GPU result in bench/results: ViT-B/16 step {flops / 1e9:.0f} GFLOP/img (counted here) at "
        f"{ESTIMATE_MFU:.0%} MFU of an H100 SXM's {ESTIMATE_PEAK / 1e12:.0f} TFLOP/s bf16")


def _timed(batches, n_images: int) -> dict:
    """Consume ``batches`` (yielding (images, labels)) until n_images; time start-up and steady rate."""
    t0 = time.perf_counter()
    seen, t_first = 0, None
    for images, _ in batches:
        if t_first is None:
            t_first, first = time.perf_counter(), len(images)
        seen += len(images)
        if seen >= n_images:
            break
    t_end = time.perf_counter()
    steady = seen - first
    if steady <= 0:
        raise SystemExit(f"one batch of {seen} images: no steady rate to measure; give more images than a batch")
    return {"images": seen, "startup_s": t_first - t0, "steady_s": t_end - t_first,
            "img_per_s": steady / (t_end - t_first), "img_per_s_incl_startup": seen / (t_end - t0)}


def run_torch(cfg: DataConfig, img_size: int, batch_size: int, cpus: int, n_images: int, seed: int) -> dict:
    dataset = build_dataset(cfg, "train", pretrain_transform(img_size), img_size)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, num_workers=cpus,
                        generator=torch.Generator().manual_seed(seed))
    return _timed(iter(loader), n_images)


def run_ray(cfg: DataConfig, img_size: int, batch_size: int, n_images: int, seed: int) -> dict:
    from ropim.data.ingest import build_ray_dataset, iter_epoch

    ds = build_ray_dataset(cfg, "train", img_size, shuffle_seed=seed)
    return _timed(iter_epoch(ds, batch_size, epoch=seed, seed=seed, device="cpu"), n_images)


def run_one_core(cfg: DataConfig, img_size: int, n: int = 1000) -> dict:
    torch.set_num_threads(1)
    images = open_source(cfg).split("train", cache_files=1)
    data = [images.load(i) for i in range(min(n, len(images)))]
    tf = pretrain_transform(img_size)
    t0 = time.perf_counter()
    decoded = [decode_rgb(d) for d in data]
    t1 = time.perf_counter()
    for img in decoded:
        tf(img)
    t2 = time.perf_counter()
    return {"images": len(data), "decode_us": 1e6 * (t1 - t0) / len(data), "transform_us": 1e6 * (t2 - t1) / len(data),
            "img_per_s": len(data) / (t2 - t0)}


def run_pretrain(data: str, steps: int, epochs: int, ingest: str) -> list[dict]:
    """A real pretraining run of the cifar_micro preset on ``data``; per-epoch wait share and img/s (from MLflow)."""
    import tempfile

    import yaml
    from mlflow.tracking import MlflowClient

    from ropim.cli import PRESETS
    from ropim.train.driver import run
    from ropim.train.pretrain.config import PretrainConfig

    raw = yaml.safe_load((PRESETS / "pretrain" / "cifar_micro.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        raw |= {"epochs": epochs, "max_steps_per_epoch": steps, "warmup_epochs": 0, "eval_every": 0, "viz_every": 0,
                "ingest": ingest, "run_name": "bench", "storage_path": f"{tmp}/ray_results"}
        raw["data"]["source"] = data
        old_uri = os.environ.get("MLFLOW_TRACKING_URI")
        os.environ["MLFLOW_TRACKING_URI"] = uri = f"sqlite:///{tmp}/mlflow.db"
        try:
            run_id = run(PretrainConfig.from_dict(raw)).run_id
            client = MlflowClient(uri)
            history = {k: {m.step: m.value for m in client.get_metric_history(run_id, k)}
                       for k in ("data_wait_share", "img_per_s", "epoch_time_s")}
        finally:
            os.environ.pop("MLFLOW_TRACKING_URI") if old_uri is None else os.environ.update(MLFLOW_TRACKING_URI=old_uri)
    return [{"epoch": e, **{k: v[e] for k, v in history.items()}} for e in sorted(history["data_wait_share"])]


def main() -> None:
    """Parse, make the synthetic data when asked, run."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=os.environ.get("ROPIM_BENCH_DATA"),
                   help="Parquet shards (or set ROPIM_BENCH_DATA; or --synthetic)")
    p.add_argument("--synthetic", type=int, default=0, help="make N photo-like JPEGs as Parquet shards and read them")
    p.add_argument("--gpu-img-per-s", type=float, default=None,
                   help="ViT-B training img/s of one GPU (default: bench/results/gpu_step_*.json, else an estimate)")
    p.add_argument("--images", type=int, default=8000, help="images per timed run")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--cpus", type=int, default=2, help="DataLoader workers = Ray's num_cpus")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--pretrain-steps", type=int, default=100, help="steps per epoch of the pretraining run (0: skip)")
    p.add_argument("--pretrain-epochs", type=int, default=2)
    p.add_argument("--pretrain-ingest", choices=("ray_data", "torch"), default="ray_data")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args()
    if not (args.data or args.synthetic):
        p.error("give --data PATH, set ROPIM_BENCH_DATA, or --synthetic N")
    with tempfile.TemporaryDirectory() as tmp:
        args.label = args.data
        if args.synthetic:
            args.data = synthetic_parquet(args.synthetic, Path(tmp))
            args.label = f"synthetic: {args.synthetic} JPEGs, 500×375, quality 90"
        run(args)


def run(args: argparse.Namespace) -> None:
    """Measure, print, write the JSON."""
    import ray

    cfg = DataConfig(args.data).resolved().validate()
    load_before = os.getloadavg()
    one_core = run_one_core(cfg, args.img_size)
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    runs = {"torch": [], "ray": []}
    try:
        for r in range(args.repeats):
            runs["torch"].append(run_torch(cfg, args.img_size, args.batch_size, args.cpus, args.images, r))
            runs["ray"].append(run_ray(cfg, args.img_size, args.batch_size, args.images, r))
            print(f"repeat {r + 1}/{args.repeats}: torch {runs['torch'][-1]['img_per_s']:.0f} img/s, "
                  f"ray {runs['ray'][-1]['img_per_s']:.0f} img/s", flush=True)
    finally:
        ray.shutdown()
    epochs = run_pretrain(args.data, args.pretrain_steps, args.pretrain_epochs, args.pretrain_ingest) \
        if args.pretrain_steps else []
    load_after = os.getloadavg()

    summary = {k: {m: statistics.median(r[m] for r in v) for m in ("img_per_s", "img_per_s_incl_startup", "startup_s")}
               for k, v in runs.items()}
    ratio = summary["ray"]["img_per_s"] / summary["torch"]["img_per_s"]
    print(f"\nParquet ({args.label}): {args.images} images/run, batch {args.batch_size}, {args.img_size}², "
          f"{args.cpus} CPUs, median of {args.repeats}")
    print(f"{'pipeline':<22}{'img/s':>10}{'incl. start-up':>16}{'start-up s':>12}")
    for name, label in (("torch", "torch DataLoader"), ("ray", "Ray Data")):
        s = summary[name]
        print(f"{label:<22}{s['img_per_s']:>10.0f}{s['img_per_s_incl_startup']:>16.0f}{s['startup_s']:>12.1f}")
    print(f"{'1 core, in-process':<22}{one_core['img_per_s']:>10.0f}   (decode {one_core['decode_us']:.0f} µs + "
          f"augment {one_core['transform_us']:.0f} µs per image)")
    print(f"Ray Data / DataLoader: {ratio:.2f}× (target ≥ {TARGET}×)  — load average {load_before[0]:.1f} → "
          f"{load_after[0]:.1f} on {os.cpu_count()} cores (shared machine)")
    per_core = summary["ray"]["img_per_s"] / args.cpus
    gpu_rate, gpu_source = vit_b_rate(args.gpu_img_per_s)
    cores = math.ceil(gpu_rate / per_core)
    print(f"\nRay Data decode + augment at {args.img_size}²: {per_core:.0f} img/s per CPU core; one GPU at "
          f"{gpu_rate:.0f} img/s (ViT-B step; {gpu_source}) needs {cores} CPU cores for the data alone")

    if epochs:
        print(f"\nPretraining (cifar_micro, {args.pretrain_ingest}, 2 workers × 0.5 CPU, "
              f"{args.pretrain_steps} steps of 128 per epoch):")
        print(f"{'epoch':>5}{'img/s':>10}{'epoch s':>10}{'data wait':>11}")
        for e in epochs:
            wait = 100 * e["data_wait_share"]
            print(f"{e['epoch']:>5}{e['img_per_s']:>10.1f}{e['epoch_time_s']:>10.1f}{wait:>10.1f}%")
        print(f"wait share after the first epoch: {100 * epochs[-1]['data_wait_share']:.1f}% "
              f"(target ≤ {100 * WAIT_TARGET:.0f}%)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "data": args.label, "images_per_run": args.images, "batch_size": args.batch_size, "img_size": args.img_size,
        "cpus": args.cpus, "repeats": args.repeats, "runs": runs, "median": summary, "one_core": one_core,
        "ray_over_torch": ratio, "target": TARGET, "ray_img_per_s_per_core": per_core,
        "gpu_vit_b_img_per_s": gpu_rate, "gpu_rate_source": gpu_source, "cpu_cores_per_gpu": cores,
        "pretrain": {"preset": "cifar_micro", "ingest": args.pretrain_ingest, "steps_per_epoch": args.pretrain_steps,
                     "epochs": epochs, "wait_target": WAIT_TARGET},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "ray": ray.__version__, "loadavg_before": load_before, "loadavg_after": load_after},
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
