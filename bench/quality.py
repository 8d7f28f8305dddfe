"""Quality benchmark on CIFAR-10: ROPIM (rop) vs SimMIM masking vs no pretraining, same compute budget.

The issue's question: at the same pretraining budget, does ROPIM beat masking, and pretraining beat none?

Data — a fixed subset of ``/work/shared/datasets/cifar10`` (the 50,000-image training split as 10 Parquet
shards ``train-0000{0..9}.parquet`` of 5,000 rows with ``image`` = PNG/JPEG bytes and ``label``), read here
with pyarrow + PIL in shard order (no shuffling, so the subset is the same on every machine):

* pretraining pool: the first ``--pretrain-images`` rows (default 10,000 = shards 0–1); labels unused;
* labelled subset (fine-tune and linear probe): the first ``--labelled-images`` rows of that pool (default 5,000);
* held-out: the first ``--test-images`` rows of the last shard ``train-00009`` (default 2,000), never seen
  in pretraining or fine-tuning. Top-1 is measured there.

Model — the same CPU-size ViT for every method: ViT-T width (192, 3 heads) with ``--depth`` blocks (default 6),
32×32 images, 4×4 patches (64 tokens), linear decoder, the ROPIM library model (``ropim.model.ROPIM``) with
``corruption`` = ``rop`` (``--rho``, default 1/7), ``mask`` (SimMIM, ``--mask-ratio``, default 0.6, mask unit = one
patch at 32²) — nothing else differs. Every method starts from the same initial weights (seeded); "none" (no
pretraining) evaluates those.

Pretraining — identical for rop and mask: same images, epochs, batch, AdamW (β 0.9/0.95, wd 0.05, none on
norms/biases/pos/cls/mask token via ``ROPIM.no_weight_decay``) from timm's ``create_optimizer_v2``, cosine
schedule with linear warm-up (timm ``CosineLRScheduler``), the paper's augmentation (``pretrain_transform``),
ℓ1 loss, plain torch in this process (no Ray). Same number of steps = same compute budget; wall time is
reported per method.

Evaluation — identical for all three encoders:

* linear probe: frozen pooled features (``forward_head(pre_logits)``) of the labelled subset → standardized →
  multinomial logistic regression (scikit-learn, L-BFGS), top-1 on held-out; kNN (k=20, DINO voting) too;
* fine-tune: all weights, AdamW with layer-wise lr decay 0.75, wd 0.05, drop path 0.1, label smoothing 0.1,
  RandomResizedCrop(0.5–1) + flip, cosine with warm-up; top-1 on held-out after the last epoch.

Default budget: batch 64, 6 pretraining epochs over 10,000 images (936 steps, 60k images seen per method),
4 fine-tuning epochs over 5,000 labelled images. ViT-T/4 at depth 6 runs ~90 img/s on 2 idle cores, so the
two pretrainings take ~2 × 11 min and the three fine-tunes + probes ~13 min: ~35 min in all (more on a
shared machine; ``--seeds 0 1`` doubles it).

Output: a table on stdout, ``bench/results/quality.json`` (``--out``), reconstruction grids
``bench/results/quality_<method>_seed<k>.png`` (``ropim.viz``), the exact command and the run time.

    .venv/bin/python bench/quality.py                       # default budget (~35 min on 2 idle cores)
    .venv/bin/python bench/quality.py --seeds 0 1           # two seeds (twice the time)
    .venv/bin/python bench/quality.py --tiny                # a 1–2 minute smoke run of the whole path
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from PIL import Image
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ropim.data import IMAGENET_MEAN, IMAGENET_STD, eval_transform, pretrain_transform
from ropim.evaluate import extract_features, knn_top1
from ropim.model import ROPIM, ModelConfig, config_dict, create_encoder
from ropim.viz import save_reconstruction_grid

DATA = Path("/work/shared/datasets/cifar10")
RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("rop", "mask", "none")  # "none" = no pretraining (the corruption key is only used for rop/mask)


def label(method: str, args: argparse.Namespace) -> str:
    """The table's name for ``method`` with its ratio."""
    rho = "1/7" if abs(args.rho - 1 / 7) < 1e-9 else f"{args.rho:g}"
    return {"rop": f"ROPIM (rop, rho {rho})", "mask": f"SimMIM (mask {args.mask_ratio:g})",
            "none": "no pretraining"}[method]
TINY = dict(pretrain_images=512, labelled_images=256, test_images=256, depth=2, pretrain_epochs=1,
            finetune_epochs=1, batch_size=64, warmup_epochs=0.5)


# ---------------------------------------------------------------- data


def read_rows(files: list[Path], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` rows of ``files`` in order: uint8 (n, 32, 32, 3) images, int64 labels."""
    imgs, labels = [], []
    for f in files:
        if len(labels) >= n:
            break
        table = pq.read_table(f, columns=["image", "label"])
        take = min(n - len(labels), table.num_rows)
        for raw, y in zip(table.column("image").to_pylist()[:take], table.column("label").to_pylist()[:take],
                          strict=True):
            img = Image.open(io.BytesIO(raw)).convert("RGB")
            if img.size != (32, 32):
                img = img.resize((32, 32), Image.BICUBIC)
            imgs.append(np.asarray(img))
            labels.append(int(y))
    if len(labels) < n:
        raise SystemExit(f"bench/quality.py: asked for {n} images, {[f.name for f in files]} hold {len(labels)}")
    return np.stack(imgs), np.asarray(labels, dtype=np.int64)


def load_subsets(data: Path, n_pretrain: int, n_labelled: int, n_test: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    shards = sorted(data.glob("train-*.parquet"))
    if len(shards) < 2:
        raise SystemExit(f"bench/quality.py: no train-*.parquet shards in {data}")
    held_out_shard, pool_shards = shards[-1], shards[:-1]
    rows_in_pool = sum(pq.read_metadata(f).num_rows for f in pool_shards)
    if n_pretrain > rows_in_pool:
        raise SystemExit(f"--pretrain-images {n_pretrain}: the pool (all shards but {held_out_shard.name}) "
                         f"holds {rows_in_pool}")
    if n_labelled > n_pretrain:
        raise SystemExit(f"--labelled-images {n_labelled} must be ≤ --pretrain-images {n_pretrain}")
    pool = read_rows(pool_shards, n_pretrain)
    return {
        "pretrain": pool,
        "labelled": (pool[0][:n_labelled], pool[1][:n_labelled]),
        "test": read_rows([held_out_shard], n_test),
    }


class ArrayDataset(Dataset):
    def __init__(self, images: np.ndarray, labels: np.ndarray, transform) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.transform(Image.fromarray(self.images[i])), int(self.labels[i])


def finetune_transform(img_size: int) -> v2.Compose:
    return v2.Compose([
        v2.PILToTensor(),
        v2.RandomResizedCrop(img_size, scale=(0.5, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


# ---------------------------------------------------------------- stages


def model_config(args, corruption: str) -> ModelConfig:
    return ModelConfig(arch="vit_tiny_patch16_224", img_size=32, patch_size=4, depth=args.depth, rho=args.rho,
                       corruption=corruption if corruption != "none" else "rop",
                       mask_ratio=args.mask_ratio).validate()


def build_model(args, corruption: str, seed: int) -> ROPIM:
    torch.manual_seed(seed)  # the same initial encoder and decoder for every method
    return ROPIM(model_config(args, corruption))


def pretrain(model: ROPIM, data, args, seed: int, log) -> dict:
    loader = DataLoader(ArrayDataset(*data, pretrain_transform(32)), batch_size=args.batch_size, shuffle=True,
                        drop_last=True, generator=torch.Generator().manual_seed(seed))
    lr = args.pretrain_base_lr * args.batch_size / 512
    opt = create_optimizer_v2(model, "adamw", lr=lr, weight_decay=0.05, betas=(0.9, 0.95))
    total = args.pretrain_epochs * len(loader)
    sched = CosineLRScheduler(opt, t_initial=total, lr_min=1e-6, warmup_t=round(args.warmup_epochs * len(loader)),
                              warmup_lr_init=1e-6, t_in_epochs=False)
    model.train()
    step, t0, losses = 0, time.perf_counter(), []
    torch.manual_seed(seed)
    for epoch in range(args.pretrain_epochs):
        epoch_loss = []
        for imgs, _ in loader:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + step)  # reproducible corruption per step
            loss, _, _ = model(imgs, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            sched.step_update(step)
            epoch_loss.append(loss.item())
        losses.append(statistics.fmean(epoch_loss))
        elapsed = time.perf_counter() - t0
        log(f"  pretrain {model.cfg.corruption} epoch {epoch + 1}/{args.pretrain_epochs} loss {losses[-1]:.4f} "
            f"{step * args.batch_size / elapsed:.1f} img/s, {elapsed / 60:.1f} min")
    elapsed = time.perf_counter() - t0
    return {"steps": step, "images_seen": step * args.batch_size, "time_s": elapsed,
            "img_per_s": step * args.batch_size / elapsed, "loss_per_epoch": losses, "lr": lr}


def linear_probe(encoder, labelled, test, seed: int) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    t0 = time.perf_counter()
    tf = eval_transform(32)
    xtr, ytr = extract_features(encoder, ArrayDataset(*labelled, tf))
    xte, yte = extract_features(encoder, ArrayDataset(*test, tf))
    knn = knn_top1(xtr, ytr, xte, yte, k=20)
    scaler = StandardScaler().fit(xtr.numpy())
    clf = LogisticRegression(max_iter=1000, C=1.0, random_state=seed)
    clf.fit(scaler.transform(xtr.numpy()), ytr.numpy())
    top1 = 100 * float((clf.predict(scaler.transform(xte.numpy())) == yte.numpy()).mean())
    return {"linear_probe_top1": top1, "knn_top1": knn, "time_s": time.perf_counter() - t0}


def finetune(model: ROPIM, labelled, test, args, seed: int, log) -> dict:
    torch.manual_seed(seed)
    clf = create_encoder(model.cfg, num_classes=10, drop_path_rate=0.1)
    missing, unexpected = clf.load_state_dict(model.encoder.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("head.") for k in missing), (missing, unexpected)
    loader = DataLoader(ArrayDataset(*labelled, finetune_transform(32)), batch_size=args.batch_size, shuffle=True,
                        drop_last=True, generator=torch.Generator().manual_seed(seed))
    test_loader = DataLoader(ArrayDataset(*test, eval_transform(32)), batch_size=256)
    lr = args.finetune_base_lr * args.batch_size / 512
    opt = create_optimizer_v2(clf, "adamw", lr=lr, weight_decay=0.05, layer_decay=0.75)
    total = args.finetune_epochs * len(loader)
    sched = CosineLRScheduler(opt, t_initial=total, lr_min=1e-6, warmup_t=round(args.warmup_epochs * len(loader)),
                              warmup_lr_init=1e-6, t_in_epochs=False)
    step, t0, curve = 0, time.perf_counter(), []
    for epoch in range(args.finetune_epochs):
        clf.train()
        for x, y in loader:
            loss = F.cross_entropy(clf(x), y, label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            sched.step_update(step)
        clf.eval()
        correct = n = 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += (clf(x).argmax(1) == y).sum().item()
                n += len(y)
        curve.append(100 * correct / n)
        log(f"  fine-tune epoch {epoch + 1}/{args.finetune_epochs} held-out top-1 {curve[-1]:.2f}% "
            f"({(time.perf_counter() - t0) / 60:.1f} min)")
    return {"finetune_top1": curve[-1], "finetune_curve": curve, "time_s": time.perf_counter() - t0, "lr": lr}


# ---------------------------------------------------------------- driver


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--pretrain-images", type=int, default=10_000)
    p.add_argument("--labelled-images", type=int, default=5_000)
    p.add_argument("--test-images", type=int, default=2_000)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--pretrain-epochs", type=int, default=6)
    p.add_argument("--rho", type=float, default=1 / 7, help="ROPIM's sketch ratio (default 1/7, the paper's)")
    p.add_argument("--mask-ratio", type=float, default=0.6, help="SimMIM's mask ratio (default 0.6)")
    p.add_argument("--pretrain-base-lr", type=float, default=4e-3, help="lr = base × batch / 512 (default 5e-4)")
    p.add_argument("--finetune-epochs", type=int, default=4)
    p.add_argument("--finetune-base-lr", type=float, default=1e-2,
                   help="lr = base × batch / 512 (default 1.25e-3; the paper's grid: 5e-3, 1e-2, 2e-2)")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--tiny", action="store_true", help=f"smoke run of the whole path: {TINY}")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/quality[_tiny].json)")
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    if args.out is None:
        args.out = RESULTS / ("quality_tiny.json" if args.tiny else "quality.json")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    command = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/quality.py", *sys.argv[1:]])
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, flush=True)

    log(f"$ {command}")
    data = load_subsets(args.data, args.pretrain_images, args.labelled_images, args.test_images)
    log(f"data: pretrain {len(data['pretrain'][1])}, labelled {len(data['labelled'][1])}, "
        f"held-out {len(data['test'][1])} images ({time.perf_counter() - t_start:.1f} s to decode)")
    rows = []
    for seed in args.seeds:
        for method in args.methods:
            log(f"[{method} seed {seed}] {label(method, args)}")
            model = build_model(args, method, seed)
            row = {"method": method, "seed": seed, "config": config_dict(model.cfg)}
            if method != "none":
                row["pretrain"] = pretrain(model, data["pretrain"], args, seed, log)
                grid = args.out.parent / f"{args.out.stem}_{method}_seed{seed}.png"
                save_reconstruction_grid(model, torch.stack([eval_transform(32)(Image.fromarray(a))
                                                             for a in data["test"][0][:6]]),
                                         grid, torch.Generator().manual_seed(0))
                row["grid_png"] = str(grid)
            row["probe"] = linear_probe(model.encoder, data["labelled"], data["test"], seed)
            log(f"  linear probe {row['probe']['linear_probe_top1']:.2f}%  kNN {row['probe']['knn_top1']:.2f}%")
            row["finetune"] = finetune(model, data["labelled"], data["test"], args, seed, log)
            rows.append(row)

    summary = {}
    for method in args.methods:
        mine = [r for r in rows if r["method"] == method]
        summary[method] = {
            key: statistics.fmean(get(r) for r in mine)
            for key, get in (
                ("finetune_top1", lambda r: r["finetune"]["finetune_top1"]),
                ("linear_probe_top1", lambda r: r["probe"]["linear_probe_top1"]),
                ("knn_top1", lambda r: r["probe"]["knn_top1"]),
                ("pretrain_time_s", lambda r: r.get("pretrain", {}).get("time_s", 0.0)),
                ("finetune_time_s", lambda r: r["finetune"]["time_s"]),
            )
        }
    run_time = time.perf_counter() - t_start
    gaps = {}
    if {"rop", "none"} <= summary.keys():
        gaps["rop_minus_none_finetune"] = summary["rop"]["finetune_top1"] - summary["none"]["finetune_top1"]
        gaps["rop_minus_none_probe"] = summary["rop"]["linear_probe_top1"] - summary["none"]["linear_probe_top1"]
    if {"rop", "mask"} <= summary.keys():
        gaps["rop_minus_mask_finetune"] = summary["rop"]["finetune_top1"] - summary["mask"]["finetune_top1"]
        gaps["rop_minus_mask_probe"] = summary["rop"]["linear_probe_top1"] - summary["mask"]["linear_probe_top1"]
    result = {
        "command": command,
        "run_time_s": run_time,
        "tiny": args.tiny,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": {
            "source": str(args.data),
            "pretrain": f"first {args.pretrain_images} rows of the shards in order (excluding the last shard)",
            "labelled": f"first {args.labelled_images} rows of the pretraining pool",
            "held_out": f"first {args.test_images} rows of the last shard",
            "labelled_class_counts": np.bincount(data["labelled"][1], minlength=10).tolist(),
            "held_out_class_counts": np.bincount(data["test"][1], minlength=10).tolist(),
        },
        "summary": summary,
        "gaps_points": gaps,
        "targets": {"rop_minus_none_finetune": ">= 3", "rop_minus_mask_finetune": ">= 0"},
        "runs": rows,
        "env": {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                "python": platform.python_version(), "machine": platform.machine(),
                "load_avg_at_end": os.getloadavg()},
    }
    args.out.write_text(json.dumps(result, indent=2))

    log("")
    log(f"CIFAR-10 subset: pretrain {args.pretrain_images} imgs x {args.pretrain_epochs} epochs, fine-tune/probe on "
        f"{args.labelled_images} labelled, top-1 on {args.test_images} held-out; ViT-T/4 depth {args.depth} at 32²; "
        f"seeds {args.seeds}")
    log(f"{'method':<24}{'pretrain min':>13}{'img/s':>8}{'kNN':>8}{'lin. probe':>12}{'fine-tune':>11}")
    for method in args.methods:
        s = summary[method]
        mine = [r for r in rows if r["method"] == method and "pretrain" in r]
        rate = f"{statistics.fmean(r['pretrain']['img_per_s'] for r in mine):.0f}" if mine else "-"
        log(f"{label(method, args):<24}{s['pretrain_time_s'] / 60:>13.1f}{rate:>8}{s['knn_top1']:>7.2f}%"
            f"{s['linear_probe_top1']:>11.2f}%{s['finetune_top1']:>10.2f}%")
    for k, v in gaps.items():
        log(f"{k}: {v:+.2f} points")
    log(f"wrote {args.out}; run time {run_time / 60:.1f} min")
    log(f"command: {command}")
    return result


if __name__ == "__main__":
    main()
