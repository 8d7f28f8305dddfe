"""Downstream evaluation of encoders: kNN on frozen features and fine-tuning with the paper's recipe.

Encoders come from any URI ``registry.load_encoder`` understands; every result is logged to MLflow
with tags naming the encoder version, and the version gets a ``downstream.<dataset>.top1`` tag.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field

import timm
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from timm.data import Mixup, auto_augment, create_transform
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch.utils.data import DataLoader

from ropim import registry
from ropim.data import IMAGENET_MEAN, IMAGENET_STD, DataConfig, build_dataset, eval_transform
from ropim.errors import ConfigError


def _posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize for current Pillow, which rejects 0 bits: keeping 0 bits gives a black image."""
    if bits_to_keep >= 8:
        return img
    return ImageOps.posterize(img, bits_to_keep) if bits_to_keep >= 1 else Image.new(img.mode, img.size)


# RandAugment "inc1" at magnitude 10 asks for 0 bits (reachable with mstd noise); Pillow ≥ 11 raises on it.
for _name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
    auto_augment.NAME_TO_OP[_name] = _posterize


@dataclass(frozen=True)
class FinetuneConfig:
    """A fine-tune of a registered encoder (the paper's recipe by default)."""

    encoder: str = f"models:/{registry.DEFAULT_ENCODER_NAME}@champion"
    random_init: bool = False  # same architecture, weights not loaded: the from-scratch baseline
    data: DataConfig = field(default_factory=DataConfig)
    epochs: int = 10
    batch_size: int = 64
    base_lr: float = 5e-3  # lr = base_lr × batch_size / 512 (the paper's grid: 5e-3, 1e-2, 2e-2)
    min_lr: float = 1e-6
    warmup_epochs: float = 5.0
    weight_decay: float = 0.05
    layer_decay: float = 0.75
    drop_path: float = 0.1
    label_smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    randaugment: str = "rand-m9-mstd0.5-inc1"  # timm's RandAugment 9 / 0.5; "" disables
    reprob: float = 0.25
    crop_scale_min: float = 0.08
    hflip: float = 0.5
    seed: int = 0
    experiment: str = "ropim-finetune"
    run_name: str | None = None

    def validate(self) -> FinetuneConfig:
        """Raise ConfigError naming the bad field and its fix."""
        self.data.validate()
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if not 0 < self.layer_decay <= 1:
            raise ConfigError(f"layer_decay={self.layer_decay}: must be in (0, 1] (the paper uses 0.65–0.75)")
        return self

    @property
    def lr(self) -> float:
        return self.base_lr * self.batch_size / 512

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def extract_features(encoder: torch.nn.Module, dataset, batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled features (N, D) and labels (N,) of ``dataset`` under a frozen encoder."""
    encoder.eval()
    feats, labels = [], []
    for x, y in DataLoader(dataset, batch_size=batch_size):
        feats.append(encoder.forward_head(encoder.forward_features(x), pre_logits=True))
        labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def knn_top1(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
             k: int = 20, temperature: float = 0.07) -> float:
    """Top-1 (%) of a cosine-similarity kNN classifier with exp(sim/T) voting (DINO's protocol)."""
    train_x, val_x = F.normalize(train_x, dim=1), F.normalize(val_x, dim=1)
    n_classes = int(max(train_y.max(), val_y.max())) + 1
    sim, idx = (val_x @ train_x.T).topk(min(k, len(train_x)), dim=1)  # (V, k)
    votes = torch.zeros(len(val_x), n_classes).scatter_add_(1, train_y[idx], (sim / temperature).exp())
    return (votes.argmax(1) == val_y).float().mean().item() * 100


def knn_eval(encoder: torch.nn.Module, img_size: int, data: DataConfig, k: int = 20) -> float:
    """kNN top-1 (%) on the val split, features of the train split as the memory bank."""
    tf = eval_transform(img_size)
    train = extract_features(encoder, build_dataset(data, "train", tf, img_size))
    val = extract_features(encoder, build_dataset(data, "val", tf, img_size))
    return knn_top1(*train, *val, k=k)


def evaluate_classifier(model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%) of ``model`` on ``loader``."""
    model.eval()
    correct1 = correct5 = n = 0
    with torch.no_grad():
        for x, y in loader:
            top = model(x).topk(min(5, model.num_classes), dim=1).indices
            correct1 += (top[:, 0] == y).sum().item()
            correct5 += (top == y[:, None]).any(1).sum().item()
            n += len(y)
    return {"top1": 100 * correct1 / n, "top5": 100 * correct5 / n}


def finetune(cfg: FinetuneConfig) -> dict[str, object]:
    """Fine-tune a classifier from ``cfg.encoder`` (or its architecture at random init); return val metrics."""
    cfg.validate()
    uri = registry.tracking_uri()
    registry.check_tracking(uri)
    torch.manual_seed(cfg.seed)
    encoder, enc_cfg = registry.load_encoder(cfg.encoder, uri)
    img_size = enc_cfg["img_size"]
    train_tf = create_transform(img_size, is_training=True, scale=(cfg.crop_scale_min, 1.0),
                                hflip=cfg.hflip, auto_augment=cfg.randaugment or None, re_prob=cfg.reprob,
                                interpolation="bicubic",
                                mean=IMAGENET_MEAN, std=IMAGENET_STD)
    train_set = build_dataset(cfg.data, "train", train_tf, img_size)
    val_set = build_dataset(cfg.data, "val", eval_transform(img_size), img_size)
    n_classes = len(train_set.classes)

    model = timm.create_model(enc_cfg["arch"], pretrained=False,
                              **{**enc_cfg["timm_kwargs"], "num_classes": n_classes, "drop_path_rate": cfg.drop_path})
    if not cfg.random_init:
        missing, _ = model.load_state_dict(encoder.state_dict(), strict=False)
        assert all(k.startswith("head.") for k in missing), missing
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    layer_decay=cfg.layer_decay)
    loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    val_loader = DataLoader(val_set, batch_size=256)
    total = cfg.epochs * len(loader)
    scheduler = CosineLRScheduler(optimizer, t_initial=total, lr_min=cfg.min_lr, warmup_t=round(cfg.warmup_epochs *
                                  len(loader)), warmup_lr_init=cfg.min_lr, t_in_epochs=False)
    mixing = cfg.mixup > 0 or cfg.cutmix > 0
    mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                  num_classes=n_classes) if mixing else None
    criterion = SoftTargetCrossEntropy() if mixing else LabelSmoothingCrossEntropy(cfg.label_smoothing)

    version = registry.resolve_version(cfg.encoder, uri)
    kind = "random-init" if cfg.random_init else "finetune"
    tags = {"ropim.kind": kind, "ropim.encoder_uri": cfg.encoder}
    if version:
        tags |= {"ropim.encoder_name": version[0], "ropim.encoder_version": version[1]}
    run_name = cfg.run_name or f"{kind}-{cfg.data.source}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id = registry.create_run(cfg.experiment, run_name, cfg.to_dict(), tags, uri)
    step, t0 = 0, time.perf_counter()
    try:
        for epoch in range(cfg.epochs):
            model.train()
            loss_sum = 0.0
            for x, y in loader:
                if mixup is not None:
                    x, y = mixup(x, y)
                loss = criterion(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                scheduler.step_update(step)
                loss_sum += loss.item()
            metrics = {"train_loss": loss_sum / len(loader), **evaluate_classifier(model, val_loader)}
            registry.log_metrics(run_id, metrics, epoch + 1, uri)
            rate = step * cfg.batch_size / (time.perf_counter() - t0)
            print(f"[{kind}] epoch {epoch + 1}/{cfg.epochs} loss {metrics['train_loss']:.3f} "
                  f"val top-1 {metrics['top1']:.2f}% {rate:.0f} img/s", flush=True)
    except BaseException:
        registry.end_run(run_id, "FAILED", uri)
        raise
    registry.end_run(run_id, "FINISHED", uri)
    if version and not cfg.random_init:
        registry.client(uri).set_model_version_tag(*version, f"downstream.{cfg.data.source}.top1",
                                                    f"{metrics['top1']:.2f}")
    return {**metrics, "run_id": run_id}


def baseline(cfg: FinetuneConfig) -> FinetuneConfig:
    """The same fine-tune from a randomly initialised encoder of the same architecture."""
    return dataclasses.replace(cfg, random_init=True)
