"""LGP-ROPIM at equal budget: ROPIM alone, ROPIM then LGP (MoCo v3 grafted on with LGP's layer-wise rates), and MoCo
v3 from random init, each scored by kNN, a linear probe and a fine-tune, over several seeds (mean ± std).

Budget: every method sees the same number of training images. ROPIM alone trains ``--epochs`` E; ROPIM then LGP
trains E − G epochs of ROPIM, then ``--graft-epochs`` G of the graft; MoCo v3 trains E epochs from a random init of
the same architecture (every block at one rate, its random patch projection frozen: MoCo v3's ViT recipe, with
MoCo v3's warm-up share, 40 of 300 epochs). An image counts once per step, whatever its views: MoCo v3 computes two
views through two encoders, so it costs about 4x ROPIM's compute per image; the wall times are reported beside.

Recipes are the shipped presets, run by the service's own code in this process (``num_workers=0``): ROPIM
``pretrain/digits_demo``, the graft ``graft/digits_demo``, the fine-tune ``finetune/digits_demo`` (the same for
every encoder); kNN (k = 20) and the linear probe on frozen features (``ropim.train.downstream.frozen_scores``). All
on the val split of the data: the built-in digits, or ``--data`` (e.g. CIFAR-10 Parquet shards from ``ropim data
convert``; its own val split or ``val_fraction``).

    PYTHONPATH=. .venv/bin/python bench/lgp_quality.py --seeds 0 1          # digits: ~1 h on 2 idle cores
    PYTHONPATH=. .venv/bin/python bench/lgp_quality.py --tiny               # the whole path in minutes
    PYTHONPATH=. .venv/bin/python bench/lgp_quality.py --data PATH/TO/cifar10-parquet --epochs 20 --graft-epochs 5

Output: a Markdown table on stdout and ``bench/results/lgp_quality[_tiny].json`` (``--out``), with the command, the
settings and wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ropim.cli import PRESETS
from ropim.data.config import DataConfig
from ropim.tracking.registry import load_encoder
from ropim.train.downstream import frozen_scores
from ropim.train.driver import run
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.graft.config import GraftConfig
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.pretrain.register import encoder_config

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("ropim", "ropim+lgp", "moco")
NAMES = {"ropim": "ROPIM alone", "ropim+lgp": "ROPIM then LGP (MoCo v3)", "moco": "MoCo v3 from random init"}
SCORES = ("knn_top1", "linear_top1", "finetune_top1")
TINY = dict(epochs=2, graft_epochs=1, finetune_epochs=1, max_steps=2, depth=2)
MOCO_WARMUP_SHARE = 40 / 300  # MoCo v3's ViT recipe


def preset(command: str, data: str, **changes) -> dict:
    """The shipped digits preset of ``command`` as a dict, on ``data``, with ``changes``."""
    d = yaml.safe_load((PRESETS / command / "digits_demo.yaml").read_text())
    return {**d, "data": {"source": data}, **changes}


def pretrain_config(args, **changes) -> PretrainConfig:
    """The ROPIM preset on the bench's data and depth, with ``changes``."""
    d = preset("pretrain", args.data, **changes)
    if args.depth:
        d["model"] = {**d["model"], "depth": args.depth}
    return PretrainConfig.from_dict(d)


def first_stage(args, seed: int, epochs: int, name: str) -> dict:
    """ROPIM for ``epochs`` of the preset: the registered encoder and the images it saw."""
    cfg = pretrain_config(args, epochs=epochs, seed=seed, num_workers=0, viz_every=0, log_every=1000, run_name=name,
                          max_steps_per_epoch=args.max_steps)
    result = run(cfg)
    return {"encoder": result.model_uri, "images": result.metrics["step"] * cfg.global_batch_size}


def second_stage(args, encoder: str, seed: int, epochs: int, name: str, moco: bool) -> dict:
    """The graft preset for ``epochs`` on ``encoder``; ``moco``: plain MoCo v3 (one rate, MoCo v3's warm-up)."""
    plain = dict(lower_blocks=0, lower_lr_ratio=1.0, warmup_epochs=max(1, round(MOCO_WARMUP_SHARE * epochs)))
    cfg = GraftConfig.from_dict(preset("graft", args.data, encoder=encoder, epochs=epochs, seed=seed, num_workers=0,
                                       eval_every=0, run_name=name, max_steps_per_epoch=args.max_steps,
                                       **(plain if moco else {})))
    result = run(cfg)
    return {"encoder": result.model_uri, "images": result.metrics["step"] * cfg.global_batch_size}


def random_encoder(cfg: PretrainConfig, seed: int, folder: Path) -> str:
    """A randomly initialised encoder of ``cfg``'s architecture, as a local encoder folder."""
    import torch
    from safetensors.torch import save_file

    from ropim.core.model import create_encoder

    torch.manual_seed(seed)
    encoder = create_encoder(cfg.model)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in encoder.state_dict().items()}, str(folder / "encoder.safetensors"))
    (folder / "config.json").write_text(json.dumps(encoder_config(cfg, encoder.embed_dim)))
    return str(folder.absolute())


def score(args, encoder: str, seed: int, name: str) -> dict:
    """kNN and linear-probe top-1 of the frozen encoder, and the fine-tune preset's top-1."""
    model, config = load_encoder(encoder)
    frozen = frozen_scores(model, config["img_size"], DataConfig(source=args.data), knn_k=20)
    epochs = {"epochs": args.finetune_epochs} if args.finetune_epochs else {}
    ft = FinetuneConfig.from_dict(preset("finetune", args.data, encoder=encoder, seed=seed, registered_model="",
                                         run_name=f"ft-{name}", max_steps_per_epoch=args.max_steps, **epochs))
    return {**frozen, "finetune_top1": run(ft).metrics["top1"]}


def run_method(args, method: str, seed: int) -> dict:
    """Train ``method`` on the budget, score it; the row of the table."""
    t0 = time.perf_counter()
    name = f"{method.replace('+', '-')}-s{seed}"
    if method == "ropim":
        out = first_stage(args, seed, args.epochs, name)
        encoder, images = out["encoder"], out["images"]
    elif method == "ropim+lgp":
        out = first_stage(args, seed, args.epochs - args.graft_epochs, f"{name}-first")
        grafted = second_stage(args, out["encoder"], seed, args.graft_epochs, name, moco=False)
        encoder, images = grafted["encoder"], out["images"] + grafted["images"]
    else:
        start = random_encoder(pretrain_config(args), seed, Path(f"random-{seed}"))
        out = second_stage(args, start, seed, args.epochs, name, moco=True)
        encoder, images = out["encoder"], out["images"]
    train_s = time.perf_counter() - t0
    scores = score(args, encoder, seed, name)
    print(f"[lgp_quality] {method} seed {seed}: " + " ".join(f"{k} {scores[k]:.2f}" for k in SCORES)
          + f" ({images} images, {train_s / 60:.1f} min training)", flush=True)
    return {"method": method, "seed": seed, "images_seen": images, "train_s": round(train_s, 1), **scores,
            "total_s": round(time.perf_counter() - t0, 1), "encoder": encoder}


def table(rows: list[dict]) -> str:
    """Mean ± std over seeds per method."""
    lines = ["| method | seeds | images seen | training (min) | kNN top-1 | linear probe top-1 | fine-tune top-1 |",
             "|---|---|---|---|---|---|---|"]
    for method in METHODS:
        rs = [r for r in rows if r["method"] == method]
        if not rs:
            continue
        cells = []
        for k in SCORES:
            v = [r[k] for r in rs]
            cells.append(f"{statistics.fmean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}")
        minutes = statistics.fmean(r["train_s"] for r in rs) / 60
        lines.append(f"| {NAMES[method]} | {len(rs)} | {rs[0]['images_seen']:,} | {minutes:.1f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="digits", help="'digits' (default) or a data set path, e.g. CIFAR-10 Parquet")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--epochs", type=int, default=40, help="the budget in epochs of the data (ROPIM alone: all)")
    p.add_argument("--graft-epochs", type=int, default=10, help="of which ROPIM then LGP grafts this many")
    p.add_argument("--finetune-epochs", type=int, default=None, help="default: the fine-tune preset's")
    p.add_argument("--max-steps", type=int, default=None, help="steps per epoch cap (smoke runs)")
    p.add_argument("--depth", type=int, default=None, help="encoder blocks (default: the pretrain preset's)")
    p.add_argument("--tiny", action="store_true", help=f"the whole path, small: {TINY}")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/lgp_quality[_tiny].json)")
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    if not 0 < args.graft_epochs < args.epochs:
        p.error(f"--graft-epochs {args.graft_epochs} must lie in (0, --epochs {args.epochs})")
    if args.data != "digits":
        args.data = str(Path(args.data).expanduser().absolute())
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = "python bench/lgp_quality.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    t0, rows = time.perf_counter(), []
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        os.chdir(tmp)  # checkpoints and MLflow artifacts stay in the scratch folder
        try:
            for seed in args.seeds:
                rows += [run_method(args, method, seed) for method in args.methods]
        finally:
            os.chdir(home)
    wall = time.perf_counter() - t0
    out = {"command": command, "wall_s": round(wall, 1), "settings": {k: str(v) if isinstance(v, Path) else v
                                                                     for k, v in vars(args).items()},
           "data": "digits" if args.data == "digits" else Path(args.data).name,
           "rows": [{k: v for k, v in r.items() if k != "encoder"} for r in rows]}
    out["settings"]["data"] = out["data"]
    path = args.out or RESULTS / f"lgp_quality{'_tiny' if args.tiny else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"\n== LGP-ROPIM at equal budget on {out['data']} (val top-1 %, mean ± std over seeds "
          f"{', '.join(map(str, args.seeds))}), {wall / 60:.1f} min ==")
    print(table(rows))
    print(f"\n{command}\nJSON: {path}")
    return out


if __name__ == "__main__":
    main()
