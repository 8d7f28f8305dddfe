"""Quality benchmark on CIFAR-10 through the service itself: ROPIM vs SimMIM masking vs no pretraining, at equal
budget, on the ``beit`` (the paper's) and ``vit`` backbones, over several seeds (mean ± std).

Every encoder is pretrained by ``ropim.train.driver.run`` (the code of ``ropim pretrain``, in this process:
``num_workers=0``), registered in a scratch MLflow store, then scored by the code of ``ropim finetune``
(``ropim.train.driver.run``, the paper's recipe trimmed for 32² as in the digits_demo fine-tune preset) and
by kNN + a linear probe on frozen features (``ropim.train.downstream.frozen_scores``). "none" scores a randomly
initialised encoder of the same architecture with exactly the same fine-tune (``baseline``).

Data: CIFAR-10 Parquet shards (``--data`` or ``ROPIM_BENCH_DATA``; e.g. written by ``ropim data convert``), train
shards ``train-*.parquet``. Fixed subsets, the same on every machine: the pretraining pool is the first
``--pretrain-images`` rows of all shards but the last; the labelled set (fine-tune, probe training, kNN memory)
is the first ``--labelled-images`` rows of that pool; the held-out set, where top-1 is measured, is the first
``--test-images`` rows of the last shard, never seen in pretraining or fine-tuning. ``rop-best`` uses ``--best-rho``,
chosen by a sweep on a separate split (say which in ``--best-rho-source``).

    ROPIM_BENCH_DATA=PATH/TO/cifar10-parquet .venv/bin/python bench/quality.py --seeds 0 1
    .venv/bin/python bench/quality.py --data PATH/TO/cifar10-parquet --tiny      # the whole path in minutes

Output: a Markdown table on stdout and ``bench/results/quality.json`` (``--out``), with the command and wall times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ropim.core.config import ModelConfig
from ropim.data.config import DataConfig
from ropim.tracking.registry import load_encoder
from ropim.train.downstream import frozen_scores
from ropim.train.driver import run
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.pretrain.config import PretrainConfig

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("rop", "rop-best", "mask", "none")
SCORES = ("knn_top1", "linear_top1", "finetune_top1")
TINY = dict(pretrain_images=512, labelled_images=256, test_images=256, depth=2, epochs=1, finetune_epochs=1)


def take_rows(files: list[Path], n: int) -> pa.Table:
    """The first ``n`` rows (image, label, path) of ``files`` in order."""
    tables, have = [], 0
    for f in files:
        if have >= n:
            break
        t = pq.read_table(f, columns=["image", "label", "path"]).slice(0, n - have)
        tables.append(t)
        have += t.num_rows
    if have < n:
        raise SystemExit(f"bench/quality.py: asked for {n} images, {[f.name for f in files]} hold {have}")
    return pa.concat_tables(tables)


def write_subsets(data: Path, args, folder: Path) -> tuple[DataConfig, DataConfig]:
    """(pretraining set, labelled set) as Parquet folders with their own split: held-out rows are ``val``."""
    shards = sorted(data.glob("train-*.parquet"))
    if len(shards) < 2:
        raise SystemExit(f"bench/quality.py: no train-*.parquet shards in {data}")
    pool = take_rows(shards[:-1], args.pretrain_images)
    held_out = take_rows(shards[-1:], args.test_images)
    classes = pq.read_schema(shards[0]).metadata
    out = []
    for name, train in (("pretrain", pool), ("labelled", pool.slice(0, args.labelled_images))):
        (folder / name).mkdir(parents=True)
        for split, table in (("train", train), ("val", held_out)):
            pq.write_table(table.replace_schema_metadata(classes), folder / name / f"{split}-00000.parquet")
        out.append(DataConfig(source=str(folder / name)))
    return out[0], out[1]


def pretrain_config(args, method: str, backbone: str, seed: int, data: DataConfig) -> PretrainConfig:
    """The same budget for every method: images, epochs, batch, schedule; only the corruption differs."""
    corruption = {"rop": "rop", "rop-best": "rop", "mask": "mask"}[method]
    rho = args.best_rho if method == "rop-best" else 1 / 7
    model = ModelConfig(img_size=32, patch_size=4, depth=args.depth, backbone=backbone, corruption=corruption,
                        rho=rho, mask_ratio=0.6, drop_path_rate=0.1)
    return PretrainConfig(model=model, data=data, epochs=args.epochs, global_batch_size=args.batch_size,
                          base_lr=args.pretrain_base_lr, warmup_epochs=1, clip_grad=5.0, num_workers=0, seed=seed,
                          viz_every=0, log_every=50, run_name=f"{method}-{backbone}-s{seed}")


def score(args, method: str, backbone: str, seed: int, pre: DataConfig, labelled: DataConfig) -> dict:
    """Pretrain (unless ``none``), then kNN, linear probe and fine-tune top-1 on the held-out set."""
    import torch

    from ropim.core.model import create_encoder

    t0 = time.perf_counter()
    cfg = pretrain_config(args, "rop" if method == "none" else method, backbone, seed, pre)
    ft = FinetuneConfig(data=labelled, epochs=args.finetune_epochs, batch_size=args.batch_size,
                        base_lr=args.finetune_base_lr, warmup_epochs=1, layer_decay=0.75, mixup=0, cutmix=0,
                        randaugment="", reprob=0, crop_scale_min=0.5, num_workers=0, seed=seed, registered_model="",
                        log_every=100, run_name=f"ft-{method}-{backbone}-s{seed}")
    if method == "none":  # the same architecture at random init, fine-tuned with exactly the same recipe
        torch.manual_seed(seed)
        encoder = create_encoder(cfg.model)
        ft = dataclasses.replace(ft, encoder=encoder_folder(encoder, cfg), random_init=True)
        seen = 0
    else:
        result = run(cfg)
        ft = dataclasses.replace(ft, encoder=result.model_uri)
        encoder, _ = load_encoder(ft.encoder)
        seen = result.metrics["step"] * cfg.global_batch_size
    t_pre = time.perf_counter() - t0
    frozen = frozen_scores(encoder, 32, labelled, knn_k=20)
    return {"method": method, "backbone": backbone, "seed": seed, "pretrain_s": round(t_pre, 1),
            "pretrain_images_seen": seen, **frozen,
            "finetune_top1": run(ft).metrics["top1"], "total_s": round(time.perf_counter() - t0, 1)}


def encoder_folder(encoder, cfg: PretrainConfig) -> str:
    """A local encoder folder holding ``encoder`` (what ``none`` fine-tunes from, at random init)."""
    from safetensors.torch import save_file

    from ropim.train.pretrain.register import encoder_config

    folder = Path(tempfile.mkdtemp(prefix="ropim-none-", dir="."))
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()}, str(folder / "encoder.safetensors"))
    (folder / "config.json").write_text(json.dumps(encoder_config(cfg, encoder.embed_dim)))
    return str(folder.absolute())


def table(rows: list[dict], args) -> str:
    """Mean ± std over seeds per (method, backbone)."""
    lines = ["| method | backbone | seeds | kNN top-1 | linear probe top-1 | fine-tune top-1 |",
             "|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["backbone"]), []).append(r)
    for (method, backbone), rs in groups.items():
        cells = []
        for k in SCORES:
            v = [r[k] for r in rs]
            cells.append(f"{statistics.fmean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}")
        names = {"rop": "rop ρ=1/7", "rop-best": f"rop ρ={args.best_rho:g}", "mask": "mask 0.6 (SimMIM)",
                 "none": "none (random init)"}
        name = names[method]
        lines.append(f"| {name} | {backbone} | {len(rs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=os.environ.get("ROPIM_BENCH_DATA"),
                   help="CIFAR-10 Parquet shards (or ROPIM_BENCH_DATA)")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--backbones", nargs="+", choices=("beit", "vit"), default=["beit", "vit"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--best-rho", type=float, default=0.5, help="rho of rop-best, from a sweep on another split")
    p.add_argument("--best-rho-source", default="the CIFAR-10 rho_ablation sweep (README)")
    p.add_argument("--pretrain-images", type=int, default=10_000)
    p.add_argument("--labelled-images", type=int, default=5_000)
    p.add_argument("--test-images", type=int, default=2_000)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=6, help="pretraining epochs")
    p.add_argument("--pretrain-base-lr", type=float, default=4e-3)
    p.add_argument("--finetune-epochs", type=int, default=4)
    p.add_argument("--finetune-base-lr", type=float, default=1e-2)
    p.add_argument("--write-subset", type=Path, default=None,
                   help="only write the pretraining pool (no held-out rows) as Parquet shards in this folder, for "
                        "the rho sweep that picks --best-rho on a split of its own (see the README), and exit")
    p.add_argument("--tiny", action="store_true", help=f"the whole path, small: {TINY}")
    p.add_argument("--merge", type=Path, nargs="+", default=None,
                   help="build the table from the rows of these JSON results (e.g. one run per seed) and exit")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/quality[_tiny].json)")
    args = p.parse_args(argv)
    if args.data is None and args.merge is None:
        p.error("give --data PATH (or ROPIM_BENCH_DATA): CIFAR-10 Parquet shards")
    args.out = args.out.absolute() if args.out else None  # the run works in a scratch folder
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    return args


def write_pool(data: Path, args, folder: Path) -> None:
    """The pretraining pool alone (``train-*`` shards, split by ropim's val_fraction rule when read)."""
    shards = sorted(data.glob("train-*.parquet"))
    pool = take_rows(shards[:-1], args.pretrain_images)
    folder.mkdir(parents=True, exist_ok=False)
    pq.write_table(pool.replace_schema_metadata(pq.read_schema(shards[0]).metadata), folder / "train-00000.parquet")
    print(f"[quality] {pool.num_rows} images of the pretraining pool -> {folder} (the held-out shard is not in it)")


def merge(args) -> dict:
    """One table from the rows of several results (e.g. seeds run in parallel processes)."""
    parts = [json.loads(f.read_text()) for f in args.merge]
    rows = [r for part in parts for r in part["rows"]]
    result = {"command": [part["command"] for part in parts], "wall_s": max(part["wall_s"] for part in parts),
              "args": parts[0]["args"], "rows": rows, "table": table(rows, args)}
    out = args.out or RESULTS / "quality.json"
    out.write_text(json.dumps(result, indent=2))
    print(f"{result['table']}\n\n{len(rows)} rows from {len(parts)} runs; {out}")
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.merge is not None:
        return merge(args)
    if args.write_subset is not None:
        write_pool(args.data.absolute(), args, args.write_subset)
        return {}
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        os.chdir(tmp)  # checkpoints and MLflow artifacts of the bench stay in the scratch folder
        pre, labelled = write_subsets(args.data.absolute(), args, Path(tmp) / "data")
        for seed in args.seeds:
            for backbone in args.backbones:
                for method in args.methods:
                    rows.append(score(args, method, backbone, seed, pre, labelled))
                    print(f"[quality] {rows[-1]}", flush=True)
    md = table(rows, args)
    out = args.out or RESULTS / ("quality_tiny.json" if args.tiny else "quality.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": shlex.join(["python", *sys.argv]), "wall_s": round(time.perf_counter() - t0, 1),
              "args": {k: str(v) for k, v in vars(args).items() if k != "data"},  # no path of this machine
              "rows": rows, "table": md}
    out.write_text(json.dumps(result, indent=2))
    print(f"\n{md}\n\nwall time {result['wall_s'] / 60:.1f} min; {out}")
    return result


if __name__ == "__main__":
    main()
