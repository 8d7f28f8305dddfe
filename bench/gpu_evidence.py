"""GPU evidence: ROPIM vs SimMIM vs no pretraining on CIFAR-10 at 32², the same pretraining time for ROPIM and SimMIM,
then the same fine-tune (recipe and epochs) for all three, val top-1 of each.

The whole data set sits on the GPU as uint8 (CIFAR-10: 150 MB) and is augmented there (random resized crop + flip
by one ``affine_grid``/``grid_sample`` per batch; Mixup/CutMix, label smoothing and random erasing for the
fine-tune), so the input never throttles the step. The model is the library's own (``ropim.core.model.ROPIM``,
``ropim.core.backbone.build_classifier``): ViT-T width, the paper's ``beit`` backbone, patch 4 (64 tokens), bf16
autocast, fused AdamW. The run is sized from step times measured in its first seconds so that it ends inside
``--minutes``: each pretraining gets the same seconds of training steps (its step count = budget / its own step
time), or with ``--pretrain-epochs`` the same epochs, and each fine-tune the same number of epochs
(``--finetune-epochs``). Fixed epochs make seeds run on hosts of different speeds train alike: the steps of this small
model are bound by the host's kernel launches, and in seconds the slowest host got 25 pretraining epochs, the
fastest 45.

Data: CIFAR-10 Parquet shards (``train-*.parquet``, columns ``image`` (encoded bytes) and ``label``; ``--data`` or
``ROPIM_BENCH_CIFAR``): the last shard is the held-out test set (never seen in pretraining or fine-tuning), the
others are the training set. ``--tiny`` runs the whole path on CPU in seconds on synthetic images.

    python bench/gpu_evidence.py --data PATH/TO/cifar10 --minutes 8
    python bench/gpu_evidence.py --tiny

A table on stdout; JSON in ``bench/results/gpu_evidence.json`` (``--out``) with the device name.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import timm
import torch
import torch.nn.functional as F
from gpu_devices import device_info  # bench/, beside this file
from record import provenance, write_json  # bench/, beside this file
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler

from ropim.core.backbone import build_classifier
from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM, encoder_spec
from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.decode import decode_rgb
from ropim.train.speed import adamw_kernels

RESULTS = Path(__file__).resolve().parent / "results"
PRETRAINED = ("rop", "mask")  # corruption of each pretrained method; "none" = no pretraining


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Everything the run holds fixed across methods."""

    depth: int = 12
    pretrain_batch: int = 1024
    pretrain_base_lr: float = 1e-3  # the paper's ViT-T rate; lr = base_lr × batch / 512
    pretrain_crop: tuple[float, float] = (0.67, 1.0)  # the paper's RandomResizedCrop scale
    finetune_batch: int = 512
    finetune_base_lr: float = 5e-3  # the lowest of the paper's grid {5e-3, 1e-2, 2e-2}
    layer_decay: float = 0.75
    finetune_crop: tuple[float, float] = (0.35, 1.0)  # 32² images: the paper's 0.08 leaves 9×9 pixels
    mixup: float = 0.8
    cutmix: float = 1.0
    label_smoothing: float = 0.1
    reprob: float = 0.25
    drop_path: float = 0.1
    warmup_share: float = 0.05  # linear warm-up over this share of each run's steps (the paper's 5 of 100 epochs)


def model_config(recipe: Recipe, corruption: str) -> ModelConfig:
    return ModelConfig(arch="vit_tiny_patch16_224", backbone="beit", img_size=32, patch_size=4, depth=recipe.depth,
                       drop_path_rate=recipe.drop_path, rho=1 / 7, corruption=corruption, init="official").validate()


# ---- data: decoded once, kept on the device as uint8 ----

def decode_shards(files: list[Path], threads: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images (N, 32, 32, 3) uint8, labels (N,)) of Parquet shards (their first ``limit`` rows), decoded with the
    library's decoder."""
    table = pa.concat_tables(pq.read_table(f, columns=["image", "label"]) for f in files).slice(0, limit)
    blobs, labels = table.column("image").to_pylist(), table.column("label").to_numpy().astype(np.int64)
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        images = list(pool.map(lambda b: np.asarray(decode_rgb(b).resize((32, 32))), blobs, chunksize=512))
    return np.stack(images), labels


def load_cifar(folder: Path, device: torch.device, limit: int | None = None) -> dict[str, torch.Tensor]:
    """Train (all shards but the last) and test (the last) images on ``device``; ``limit``: the first rows of each."""
    shards = sorted(folder.glob("train-*.parquet"))
    if len(shards) < 2:
        raise SystemExit(f"bench/gpu_evidence.py: --data {folder}: need at least 2 train-*.parquet shards (the last "
                         "is held out for testing)")
    threads = min(16, os.cpu_count() or 1)
    (x, y), (tx, ty) = decode_shards(shards[:-1], threads, limit), decode_shards(shards[-1:], threads, limit)
    return to_device(x, y, tx, ty, device)


def synthetic(n_train: int, n_test: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """Images of 10 classes (a class template + noise): the --tiny path without CIFAR."""
    rng = np.random.default_rng(seed)
    templates = rng.integers(0, 256, (10, 32, 32, 3))

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 10, n)
        return np.clip(templates[y] * 0.7 + rng.integers(0, 77, (n, 32, 32, 3)), 0, 255).astype(np.uint8), y

    return to_device(*draw(n_train), *draw(n_test), device)


def to_device(x: np.ndarray, y: np.ndarray, tx: np.ndarray, ty: np.ndarray, device: torch.device) -> dict:
    def images(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).permute(0, 3, 1, 2).contiguous().to(device)  # (N, 3, 32, 32) uint8

    return dict(x=images(x), y=torch.from_numpy(y).to(device), test_x=images(tx),
                test_y=torch.from_numpy(ty).to(device))


# ---- augmentation on the device ----

@functools.cache
def mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ImageNet mean and std as (1, 3, 1, 1) tensors on ``device``, made once (no host copy per step)."""
    return tuple(torch.tensor(v, device=device).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))


def normalize(x: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float, ImageNet mean/std (the library's normalization)."""
    mean, std = mean_std(x.device)
    return (x.float() / 255 - mean) / std


def resized_crop_flip(x: torch.Tensor, scale: tuple[float, float], gen: torch.Generator,
                      ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """A random resized crop (area share in ``scale``, aspect in ``ratio``; sides clamped to the image instead of
    torchvision's 10 retries) and a horizontal flip with p = 0.5, per image, by one bilinear ``grid_sample``."""
    b, dev = x.shape[0], x.device
    u = torch.rand(b, 5, device=dev, generator=gen)
    area = scale[0] + (scale[1] - scale[0]) * u[:, 0]
    aspect = torch.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * u[:, 1])
    w, h = (area * aspect).sqrt().clamp(max=1.0), (area / aspect).sqrt().clamp(max=1.0)  # shares of the side
    cx, cy = (2 * u[:, 2] - 1) * (1 - w), (2 * u[:, 3] - 1) * (1 - h)  # centres in [-1, 1] keeping the box inside
    flip = torch.where(u[:, 4] < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3, device=dev)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = w * flip, cx, h, cy
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def random_erase(x: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """timm's RandomErasing (mode 'pixel', one box, area 2–33 %, log-uniform aspect 0.3–3.3) for a whole batch."""
    b, _, hgt, wid = x.shape
    u = torch.rand(b, 5, device=x.device, generator=gen)
    area = (0.02 + (1 / 3 - 0.02) * u[:, 0]) * hgt * wid
    aspect = torch.exp(math.log(0.3) + (math.log(1 / 0.3) - math.log(0.3)) * u[:, 1])
    eh, ew = (area * aspect).sqrt().round().clamp(1, hgt), (area / aspect).sqrt().round().clamp(1, wid)
    top, left = (u[:, 2] * (hgt - eh + 1)).floor(), (u[:, 3] * (wid - ew + 1)).floor()
    rows = torch.arange(hgt, device=x.device).view(1, hgt, 1)
    cols = torch.arange(wid, device=x.device).view(1, 1, wid)
    box = ((rows >= top.view(-1, 1, 1)) & (rows < (top + eh).view(-1, 1, 1)) & (cols >= left.view(-1, 1, 1))
           & (cols < (left + ew).view(-1, 1, 1)) & (u[:, 4] < p).view(-1, 1, 1))
    noise = torch.randn(x.shape, device=x.device, generator=gen, dtype=x.dtype)
    return torch.where(box.unsqueeze(1), noise, x)


class Batches:
    """Shuffled batches of indices into the device-resident training set, epoch after epoch (drop last)."""

    def __init__(self, n: int, batch: int, gen: torch.Generator) -> None:
        self.n, self.batch, self.gen, self.order, self.pos, self.epochs = n, batch, gen, None, n, 0

    def __call__(self) -> torch.Tensor:
        if self.pos + self.batch > self.n:
            self.order, self.pos = torch.randperm(self.n, device=self.gen.device, generator=self.gen), 0
            self.epochs += 1
        self.pos += self.batch
        return self.order[self.pos - self.batch:self.pos]

    @property
    def seen_epochs(self) -> float:
        return self.epochs - 1 + self.pos / self.n


# ---- one training run ----

def schedule(opt: torch.optim.Optimizer, steps: int, warmup_share: float) -> CosineLRScheduler:
    """The loop's schedule: linear warm-up inside a cosine to 1e-6 over ``steps`` optimizer steps (timm)."""
    return CosineLRScheduler(opt, t_initial=steps, lr_min=1e-6, warmup_t=max(1, round(warmup_share * steps)),
                             warmup_lr_init=1e-6, t_in_epochs=False)


def run_steps(step, steps: int, name: str, batch: int, sync) -> dict:
    """Call ``step(i)`` ``steps`` times with a progress line about every 10 s; seconds and the last loss."""
    t0 = last = time.perf_counter()
    loss = torch.zeros(())
    for i in range(steps):
        loss = step(i)
        if time.perf_counter() - last > 10:
            sync()
            last, done = time.perf_counter(), i + 1
            rate = done * batch / (last - t0)
            print(f"  [{name}] step {done}/{steps} loss {float(loss):.4f} {rate:,.0f} img/s "
                  f"ETA {(steps - done) * batch / rate:.0f} s", flush=True)
    sync()
    seconds = time.perf_counter() - t0
    return dict(steps=steps, seconds=seconds, img_per_s=steps * batch / max(seconds, 1e-9), last_loss=float(loss))


class Pretraining:
    """ROPIM (corruption rop) or SimMIM (mask) pretraining of the same encoder on the device-resident images."""

    def __init__(self, corruption: str, data: dict, recipe: Recipe, seed: int, args) -> None:
        torch.manual_seed(seed)
        dev = data["x"].device
        self.data, self.recipe, self.args = data, recipe, args
        self.model = ROPIM(model_config(recipe, corruption)).to(dev).train()
        self.lr = recipe.pretrain_base_lr * recipe.pretrain_batch / 512
        self.opt = create_optimizer_v2(self.model, "adamw", lr=self.lr, weight_decay=0.05, betas=(0.9, 0.95),
                                       **adamw_kernels("fused" if dev.type == "cuda" else "default"))
        self.gen = torch.Generator(dev).manual_seed(seed)
        self.batches = Batches(data["x"].shape[0], recipe.pretrain_batch, self.gen)
        self.autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16)
        self.sched = None

    def step(self, i: int) -> torch.Tensor:
        x = normalize(self.data["x"][self.batches()])
        x = resized_crop_flip(x, self.recipe.pretrain_crop, self.gen)
        corruption = self.model.draw_corruption(x.shape[0], self.gen)
        with self.autocast:
            loss = self.model(x, corruption=corruption)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 5.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.sched is not None:
            self.sched.step_update(i + 1)
        return loss.detach()

    def train(self, steps: int, sync) -> dict:
        self.sched = schedule(self.opt, steps, self.recipe.warmup_share)
        stats = run_steps(self.step, steps, self.model.cfg.corruption, self.recipe.pretrain_batch, sync)
        return dict(stats, epochs=self.batches.seen_epochs, lr=self.lr)


class Finetune:
    """The same fine-tune for every method: classifier from the encoder (``None``: random init), layer decay,
    Mixup/CutMix + label smoothing, random erasing, drop path, AdamW, warm-up + cosine."""

    def __init__(self, state: dict | None, data: dict, recipe: Recipe, seed: int, args,
                 layer_decay: float | None) -> None:
        torch.manual_seed(seed)
        dev = data["x"].device
        name, kwargs = encoder_spec(model_config(recipe, "none"))
        self.model = build_classifier(name, kwargs, state, 10, drop_path=recipe.drop_path).model.to(dev).train()
        self.data, self.recipe, self.args = data, recipe, args
        self.lr = recipe.finetune_base_lr * recipe.finetune_batch / 512
        self.opt = create_optimizer_v2(self.model, "adamw", lr=self.lr, weight_decay=0.05, layer_decay=layer_decay,
                                       **adamw_kernels("fused" if dev.type == "cuda" else "default"))
        self.gen = torch.Generator(dev).manual_seed(seed)
        self.batches = Batches(data["x"].shape[0], recipe.finetune_batch, self.gen)
        self.mixup = Mixup(mixup_alpha=recipe.mixup, cutmix_alpha=recipe.cutmix,
                           label_smoothing=recipe.label_smoothing, num_classes=10)
        self.criterion = SoftTargetCrossEntropy()
        self.autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16)
        self.sched = None

    def step(self, i: int) -> torch.Tensor:
        idx = self.batches()
        x = resized_crop_flip(normalize(self.data["x"][idx]), self.recipe.finetune_crop, self.gen)
        x, y = self.mixup(x, self.data["y"][idx])
        x = random_erase(x, self.recipe.reprob, self.gen)
        with self.autocast:
            loss = self.criterion(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.sched is not None:
            self.sched.step_update(i + 1)
        return loss.detach()

    @torch.no_grad()
    def top1(self) -> float:
        self.model.eval()
        hits = 0
        for i in range(0, self.data["test_x"].shape[0], 1000):
            with self.autocast:
                logits = self.model(normalize(self.data["test_x"][i:i + 1000]))
            hits += int((logits.argmax(1) == self.data["test_y"][i:i + 1000]).sum())
        self.model.train()
        return 100 * hits / self.data["test_x"].shape[0]

    def train(self, epochs: int, sync, label: str) -> dict:
        steps_per_epoch = self.data["x"].shape[0] // self.recipe.finetune_batch
        self.sched = schedule(self.opt, epochs * steps_per_epoch, self.recipe.warmup_share)
        stats = run_steps(self.step, epochs * steps_per_epoch, label, self.recipe.finetune_batch, sync)
        return dict(stats, epochs=epochs, lr=self.lr, top1=self.top1())


# ---- sizing, the runs, the report ----

def seconds_per_step(step, sync, warmup: int, timed: int, blocks: int) -> float:
    """Median over ``blocks`` blocks of the mean seconds of ``timed`` calls of ``step``, after ``warmup`` untimed ones.

    The median, so that one slow block (a late autotune, the host busy for a moment) does not set the budget: in the
    seed-9 window one mean of 10 steps read the fine-tune step 51% slow and cost the pretrainings 24 s each.
    """
    for i in range(warmup):
        step(i)
    means = []
    for b in range(blocks):
        sync()
        t0 = time.perf_counter()
        for i in range(timed):
            step(warmup + b * timed + i)
        sync()
        means.append((time.perf_counter() - t0) / timed)
    return statistics.median(means)


def plan(args, data: dict, recipe: Recipe, sync, t_start: float) -> dict:
    """Step times measured now, and the budget they give: pretraining steps per method, fine-tune epochs."""
    seed, warm, timed, blocks = args.seed, (1 if args.tiny else 3), (2 if args.tiny else 5), (1 if args.tiny else 3)
    step_s = {c: seconds_per_step(Pretraining(c, data, recipe, seed, args).step, sync, warm, timed, blocks)
              for c in PRETRAINED}
    step_s["finetune"] = seconds_per_step(Finetune(None, data, recipe, seed, args, recipe.layer_decay).step, sync,
                                          warm, timed, blocks)
    left = 60 * args.minutes * (1 - args.reserve) - (time.perf_counter() - t_start)
    if left <= 0:
        raise SystemExit(f"bench/gpu_evidence.py: --minutes {args.minutes} is spent before training starts "
                         f"(loading and measuring took {time.perf_counter() - t_start:.0f} s)")
    return dict(split(args, data["x"].shape[0], recipe, step_s, left), step_s=step_s, seconds_left=left)


def split(args, n: int, recipe: Recipe, step_s: dict, left: float) -> dict:
    """``left`` seconds shared out: pretraining steps per method (equal seconds, or equal epochs with
    ``--pretrain-epochs``) and the fine-tune epochs every method gets; SystemExit when the fixed lengths do not fit."""
    finetunes = len(PRETRAINED) + 2  # rop, mask, none with the recipe's layer decay, none without
    epoch_s = n // recipe.finetune_batch * step_s["finetune"]
    if args.pretrain_epochs:  # the same steps for both: their step times differ by 1-2% on the GPUs measured
        steps = dict.fromkeys(PRETRAINED, max(1, round(args.pretrain_epochs * n / recipe.pretrain_batch)))
        pretrain_s = sum(steps[c] * step_s[c] for c in PRETRAINED)
        epochs = args.finetune_epochs or math.floor((left - pretrain_s) / finetunes / epoch_s)
    else:  # the same seconds for each: the slower step gets fewer steps
        epochs = args.finetune_epochs or max(1, math.floor((1 - args.pretrain_share) * left / finetunes / epoch_s))
        pretrain_s = left - finetunes * epochs * epoch_s if args.finetune_epochs else args.pretrain_share * left
        steps = {c: max(1, round(pretrain_s / len(PRETRAINED) / step_s[c])) for c in PRETRAINED}
    finetune_s = finetunes * max(epochs, 1) * epoch_s
    if epochs < 1 or pretrain_s <= 0 or pretrain_s + finetune_s > left:
        fixed = " and ".join(f"--{flag} {value}" for flag, value in (("pretrain-epochs", args.pretrain_epochs),
                                                                         ("finetune-epochs", args.finetune_epochs))
                             if value)
        need = f"{pretrain_s:.0f} s of pretraining and " if pretrain_s > 0 else ""
        raise SystemExit(f"bench/gpu_evidence.py: {fixed} need {need}{finetune_s:.0f} s of fine-tuning and "
                         f"{left:.0f} s are left; give fewer epochs or more --minutes")
    return dict(pretrain_s={c: steps[c] * step_s[c] for c in PRETRAINED}, pretrain_steps=steps,
                pretrain_epochs={c: steps[c] * recipe.pretrain_batch / n for c in PRETRAINED}, finetune_epochs=epochs)


def run_all(args, data: dict, recipe: Recipe, budget: dict, sync, save) -> list[dict]:
    """Pretrain + fine-tune ROPIM and SimMIM, fine-tune from random init; ``save(rows)`` after every run."""
    rows: list[dict] = []
    for c in PRETRAINED:
        pre = Pretraining(c, data, recipe, args.seed, args)
        stats = pre.train(budget["pretrain_steps"][c], sync)
        print(f"[{c}] pretrained {stats['steps']} steps ({stats['epochs']:.1f} epochs) in {stats['seconds']:.0f} s, "
              f"{stats['img_per_s']:,.0f} img/s, last loss {stats['last_loss']:.4f}", flush=True)
        state = pre.model.encoder.state_dict()
        del pre
        ft = Finetune(state, data, recipe, args.seed, args, recipe.layer_decay).train(budget["finetune_epochs"],
                                                                                        sync, f"{c} finetune")
        print(f"[{c}] fine-tuned {ft['epochs']} epochs in {ft['seconds']:.0f} s: top-1 {ft['top1']:.2f}%", flush=True)
        rows.append(dict(method={"rop": "ROPIM", "mask": "SimMIM"}[c], corruption=c, pretrain=stats, finetune=ft,
                         layer_decay=recipe.layer_decay))
        save(rows)
    for decay in (recipe.layer_decay, None):
        label = f"none finetune (layer decay {decay or 'off'})"
        ft = Finetune(None, data, recipe, args.seed, args, decay).train(budget["finetune_epochs"], sync, label)
        print(f"[none] {label}: {ft['epochs']} epochs in {ft['seconds']:.0f} s: top-1 {ft['top1']:.2f}%", flush=True)
        rows.append(dict(method="none", corruption=None, pretrain=None, finetune=ft, layer_decay=decay))
        save(rows)
    return rows


def print_table(rows: list[dict], name: str) -> None:
    print(f"\nCIFAR-10 held-out top-1 on {name} (ViT-T width, beit, 32² / patch 4):")
    print(f"{'method':<8} {'layer decay':>11} {'pretrain s':>10} {'pretrain ep':>11} {'img/s':>9} "
          f"{'finetune ep':>11} {'top-1 %':>8}")
    for r in rows:
        p = r["pretrain"] or {}
        print(f"{r['method']:<8} {str(r['layer_decay'] or 'off'):>11} {p.get('seconds', 0):10.0f} "
              f"{p.get('epochs', 0):11.1f} {p.get('img_per_s', 0):9,.0f} {r['finetune']['epochs']:11d} "
              f"{r['finetune']['top1']:8.2f}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=os.environ.get("ROPIM_BENCH_CIFAR"),
                    help="CIFAR-10 Parquet folder (default $ROPIM_BENCH_CIFAR)")
    ap.add_argument("--minutes", type=float, default=8.0, help="the whole run, loading and measuring included")
    ap.add_argument("--pretrain-share", type=float, default=0.55, help="share of the training time for pretraining")
    ap.add_argument("--finetune-epochs", type=int, help="fine-tune every method this many epochs and give the "
                    "pretrainings the rest of the time (default: --pretrain-share sets both)")
    ap.add_argument("--pretrain-epochs", type=int, help="pretrain both methods this many epochs (the same steps) "
                    "instead of the same seconds, so that seeds run on hosts of different speeds pretrain alike")
    ap.add_argument("--reserve", type=float, default=0.08, help="share of --minutes kept for building and evaluation")
    ap.add_argument("--depth", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fp32", dest="bf16", action="store_false", help="no bf16 autocast")
    ap.add_argument("--out", type=Path, default=RESULTS / "gpu_evidence.json")
    ap.add_argument("--tiny", action="store_true", help="CPU, synthetic images, depth 1, small batches: seconds")
    args = ap.parse_args(argv)
    if not args.tiny and args.data is None:
        ap.error("give --data PATH (CIFAR-10 Parquet shards) or set ROPIM_BENCH_CIFAR, or run --tiny")
    if not 0 < args.pretrain_share < 1 or not 0 <= args.reserve < 1 or args.minutes <= 0 or args.depth < 1:
        ap.error("need 0 < --pretrain-share < 1, 0 <= --reserve < 1, --minutes > 0 and --depth >= 1")
    for flag, value in (("--finetune-epochs", args.finetune_epochs), ("--pretrain-epochs", args.pretrain_epochs)):
        if value is not None and value <= 0:
            ap.error(f"{flag} {value}: give more than 0, or leave it out")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    t_start = time.perf_counter()
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    name = device_info(device)[0]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    print(f"{name}; torch {torch.__version__}, timm {timm.__version__}; {args.minutes} min", flush=True)
    if args.tiny:
        recipe = Recipe(depth=1, pretrain_batch=32, finetune_batch=32)
        data = synthetic(256, 64, device) if args.data is None else load_cifar(args.data, device, limit=256)
    else:
        recipe = Recipe(depth=args.depth)
        data = load_cifar(args.data, device)
    load_s = time.perf_counter() - t_start
    print(f"data on {device}: {data['x'].shape[0]} train / {data['test_x'].shape[0]} test images in {load_s:.1f} s",
          flush=True)
    budget = plan(args, data, recipe, sync, t_start)
    print("measured s/step: " + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in budget["step_s"].items())
          + "; plan: pretraining " + ", ".join(f"{c} {budget['pretrain_s'][c]:.0f} s "
                                              f"({budget['pretrain_epochs'][c]:.1f} epochs)" for c in PRETRAINED)
          + f", {budget['finetune_epochs']} fine-tune epochs", flush=True)

    def save(rows: list[dict]) -> dict:
        report = dict(benchmark="gpu_evidence", device=str(device), device_name=name, torch=torch.__version__,
                      timm=timm.__version__, python=platform.python_version(), minutes=args.minutes, seed=args.seed,
                      bf16=args.bf16, recipe=dataclasses.asdict(recipe), n_train=int(data["x"].shape[0]),
                      data=str(args.data) if args.data else "synthetic", n_test=int(data["test_x"].shape[0]),
                      load_s=load_s, plan=budget, complete=len(rows) == len(PRETRAINED) + 2,
                      peak_mem_mib=torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
                      rows=rows, **provenance("bench/gpu_evidence.py", argv, t_start))
        write_json(report, args.out)
        return report

    rows = run_all(args, data, recipe, budget, sync, save)
    print_table(rows, name)
    report = save(rows)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s of {60 * args.minutes:.0f})")
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
