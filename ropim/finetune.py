"""Fine-tuning an encoder into a classifier with the paper's recipe (timm), on Ray Train or in-process.

``finetune(cfg)`` resolves and checks the encoder against the data (one clear error before any work), opens
(or re-opens) the MLflow run, runs ``train_loop_per_worker`` on ``cfg.num_workers`` Ray Train workers (the
TorchTrainer of ``ropim.runtime``, as pretraining's; checkpoints from ``ropim.checkpoint``) or, with
``num_workers=0``, the same loop in this process. At the end it logs top-1 / top-5, per-class accuracy and a
confusion-matrix PNG, registers the classifier (``ropim-classifier``, safetensors, loaded without pickle) and
tags the encoder version with ``downstream.<dataset>.top1``.

Re-running a named run (same ``run_name`` and ``storage_path``) continues from its latest checkpoint with the
same step count, LR schedule and MLflow run; ``stop_after_epochs`` ends a job early on purpose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from safetensors.torch import load_file
from timm.data import Mixup, auto_augment, create_transform
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ropim import registry
from ropim.checkpoint import load_checkpoint, read_run_meta, save_checkpoint, write_run_meta
from ropim.data import IMAGENET_MEAN, IMAGENET_STD, DataConfig, build_dataset, eval_transform
from ropim.downstream import (
    EncoderRef,
    build_model,
    classifier_config,
    confusion_matrix,
    dataset_name,
    ensure_logging,
    eval_split,
    log_results,
    resolve_encoder,
    resolved_data,
    run_tags,
    tag_version,
    topk_hits,
)
from ropim.errors import ConfigError
from ropim.runtime import autocast_dtype, check_precision, grad_scaler, optimizer_step, ray_session, torch_trainer

log = logging.getLogger("ropim.finetune")
# Fields that may differ when a named run is continued; everything else must match the stored config.
RESUMABLE = ("num_workers", "use_gpu", "cpus_per_worker", "stop_after_epochs", "max_failures", "log_every",
             "dataloader_workers")
EVAL_FILE = "eval.json"


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
    """A fine-tune of a registered encoder (the paper's recipe by default); ``ropim finetune --help`` lists it."""

    encoder: str = f"models:/{registry.DEFAULT_ENCODER_NAME}@champion"
    random_init: bool = False  # same architecture, weights not loaded: the from-scratch baseline
    data: DataConfig = field(default_factory=DataConfig)
    img_size: int | None = None  # None: the encoder's; another size resamples the position embedding
    epochs: int = 10
    batch_size: int = 64  # global: split over num_workers
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
    clip_grad: float | None = None
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast + grad scaler, GPU only)
    num_workers: int = 2  # Ray Train workers; 0 runs the same loop in this process (no Ray)
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    dataloader_workers: int = 0  # DataLoader processes per worker
    seed: int = 0
    eval_every: int = 1  # epochs between val evaluations (the last epoch always evaluates)
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always checkpoints)
    keep_checkpoints: int = 2
    max_failures: int = 1  # worker-group restarts from the latest checkpoint before the run fails
    stop_after_epochs: int | None = None  # train this many epochs in this job, checkpoint, stop (re-run continues)
    max_steps_per_epoch: int | None = None  # cap for smoke runs
    log_every: int = 20  # steps between progress lines
    experiment: str = "ropim-finetune"
    run_name: str | None = None
    storage_path: str = "ray_results"
    registered_model: str = registry.DEFAULT_CLASSIFIER_NAME  # "" = do not register the classifier

    def validate(self) -> FinetuneConfig:
        """Raise ConfigError naming the bad field and its fix."""
        self.data.validate()
        for name in ("epochs", "batch_size", "keep_checkpoints", "eval_every", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if self.num_workers < 0:
            raise ConfigError(f"num_workers={self.num_workers}: must be ≥ 0 (0 = in this process, no Ray)")
        workers = max(1, self.num_workers)
        if self.batch_size % workers:
            raise ConfigError(f"batch_size={self.batch_size} is not divisible by num_workers={self.num_workers}")
        if (self.mixup > 0 or self.cutmix > 0) and (self.batch_size // workers) % 2:
            raise ConfigError(f"batch_size={self.batch_size}: Mixup/CutMix needs an even batch per worker "
                              f"(here {self.batch_size // workers}); change batch_size or set mixup=0 cutmix=0")
        if not 0 < self.layer_decay <= 1:
            raise ConfigError(f"layer_decay={self.layer_decay}: must be in (0, 1] (the paper uses 0.65–0.75)")
        if self.base_lr <= 0:
            raise ConfigError(f"base_lr={self.base_lr}: must be > 0")
        if self.img_size is not None and self.img_size <= 0:
            raise ConfigError(f"img_size={self.img_size}: must be > 0, or null for the encoder's")
        check_precision(self.precision, self.use_gpu)
        if self.num_workers == 0 and "://" in self.storage_path:
            raise ConfigError(f"storage_path={self.storage_path}: in-process runs (num_workers=0) keep checkpoints "
                              "in a local folder; give one, or use num_workers ≥ 1")
        if self.num_workers == 0 and self.use_gpu and not torch.cuda.is_available():
            raise ConfigError("use_gpu=true with num_workers=0 but no CUDA device is visible in this process")
        return self

    @property
    def lr(self) -> float:
        """Peak learning rate after the linear scaling rule."""
        return self.base_lr * self.batch_size / 512

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FinetuneConfig:
        d = dict(d)
        d["data"] = DataConfig(**d.get("data", {}))
        return cls(**d)


def baseline(cfg: FinetuneConfig) -> FinetuneConfig:
    """The same fine-tune from a randomly initialised encoder of the same architecture."""
    return dataclasses.replace(cfg, random_init=True)


def train_transform(cfg: FinetuneConfig, img_size: int):
    """The recipe's augmentation: RandomResizedCrop, flip, RandAugment, random erasing, normalisation (timm)."""
    return create_transform(img_size, is_training=True, scale=(cfg.crop_scale_min, 1.0), hflip=cfg.hflip,
                            auto_augment=cfg.randaugment or None, re_prob=cfg.reprob, interpolation="bicubic",
                            mean=IMAGENET_MEAN, std=IMAGENET_STD)


@torch.no_grad()
def _evaluate(model: torch.nn.Module, loader, n_classes: int, device: torch.device,
              amp_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([top-1 hits, top-5 hits, n], confusion (K, K)) of ``model`` on ``loader``."""
    model.eval()
    counts, conf = torch.zeros(3, dtype=torch.long), torch.zeros(n_classes, n_classes, dtype=torch.long)
    for x, y in loader:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(x.to(device)).float()
        h1, h5 = topk_hits(logits, y)
        counts += torch.tensor([h1, h5, len(y)])
        conf += confusion_matrix(logits.argmax(1), y, n_classes)
    return counts, conf


def evaluate_classifier(model: torch.nn.Module, loader: DataLoader) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%) of ``model`` on ``loader``."""
    counts, _ = _evaluate(model, loader, model.num_classes, next(model.parameters()).device)
    return {"top1": 100 * counts[0].item() / counts[2].item(), "top5": 100 * counts[1].item() / counts[2].item()}


def _seed_all(seed: int, epoch: int, rank: int) -> None:
    """Augmentation (torch, python ``random`` for RandAugment / erasing, numpy for Mixup) and drop path per
    (seed, epoch, rank), so a resumed run repeats exactly what an uninterrupted one would do."""
    s = ((seed * 1_000_003 + rank) * 1_000_000_007 + epoch) % 2**63
    torch.manual_seed(s)
    random.seed(s)
    np.random.seed(s % 2**32)


# ----------------------------------------------------------------------------------------------- sessions


class RaySession:
    """The loop's view of a Ray Train worker."""

    def __init__(self) -> None:
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()

    def restore(self, load):
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as d:
            return load(d)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model, move_to_device=False)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return t
        moved = t.to(self.device) if self.device.type == "cuda" else t.clone()
        torch.distributed.all_reduce(moved)
        return moved.cpu()

    def report(self, metrics: dict, folder: Path | None) -> None:
        import ray.train

        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(folder)) if folder else None)


class LocalSession:
    """The same loop in this process: checkpoints in ``<storage_path>/<run_name>/in_process/checkpoint_<epoch>``."""

    rank, world = 0, 1

    def __init__(self, cfg: FinetuneConfig) -> None:
        self.device = torch.device("cuda" if cfg.use_gpu else "cpu")
        self.folder = Path(cfg.storage_path).absolute() / cfg.run_name / "in_process"
        self.keep = cfg.keep_checkpoints
        self.metrics: dict = {}

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (a folder is complete once renamed into place)."""
        return sorted(self.folder.glob("checkpoint_[0-9]*")) if self.folder.is_dir() else []

    @property
    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def restore(self, load):
        return load(self.latest) if self.latest else None

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def report(self, metrics: dict, folder: Path | None) -> None:
        self.metrics = metrics
        if folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        dest = self.folder / f"checkpoint_{metrics['epoch']:06d}"
        tmp = self.folder / f".tmp_{dest.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(folder, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        for old in self.checkpoints()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------------------------- the loop


def run_loop(cfg: FinetuneConfig, run_id: str, tracking: str, session) -> None:
    """Fine-tune on one worker of ``session`` (Ray Train or local); rank 0 logs to MLflow and writes checkpoints."""
    rank, world, device = session.rank, session.world, session.device
    kind = "random-init" if cfg.random_init else "finetune"
    torch.manual_seed(cfg.seed)  # identical initial head (and random-init weights) on every rank
    state, enc_cfg = registry.load_encoder_files(cfg.encoder, tracking)
    img_size = cfg.img_size or enc_cfg["img_size"]
    train_set = build_dataset(cfg.data, "train", train_transform(cfg, img_size), img_size)
    val_set = build_dataset(cfg.data, "val", eval_transform(img_size), img_size)
    classes = list(train_set.classes)
    n_classes = len(classes)
    model = build_model(enc_cfg, None if cfg.random_init else state, n_classes, img_size, cfg.drop_path,
                        uri=cfg.encoder, quiet=rank != 0).to(device)
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    layer_decay=cfg.layer_decay)
    scaler = grad_scaler(cfg.precision)
    start_epoch, step = 0, 0
    restored = session.restore(lambda d: load_checkpoint(d, model, optimizer, scaler))
    if restored:
        start_epoch, step = restored["epoch"] + 1, restored["step"]
        if rank == 0:
            log.info(f"[{kind}] resumed from epoch {start_epoch}, step {step}")
    ddp_model = session.prepare_model(model)

    local_batch = cfg.batch_size // world
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=local_batch, sampler=sampler, drop_last=True,
                        num_workers=cfg.dataloader_workers, pin_memory=device.type == "cuda",
                        persistent_workers=cfg.dataloader_workers > 0)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=max(local_batch, 64),
                            num_workers=cfg.dataloader_workers)
    steps_per_epoch = len(loader)
    if cfg.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps_per_epoch)
    if steps_per_epoch < 1:
        raise ConfigError(f"batch_size={cfg.batch_size}: larger than the training split on each worker")
    total_steps = cfg.epochs * steps_per_epoch
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps, lr_min=cfg.min_lr,
                                  warmup_t=round(cfg.warmup_epochs * steps_per_epoch), warmup_lr_init=cfg.min_lr,
                                  t_in_epochs=False)
    scheduler.step_update(step)
    mixing = cfg.mixup > 0 or cfg.cutmix > 0
    mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                  num_classes=n_classes) if mixing else None
    criterion = SoftTargetCrossEntropy() if mixing else LabelSmoothingCrossEntropy(cfg.label_smoothing)
    amp_dtype = autocast_dtype(cfg.precision)
    last_epoch = cfg.epochs if cfg.stop_after_epochs is None else min(cfg.epochs, start_epoch + cfg.stop_after_epochs)

    for epoch in range(start_epoch, last_epoch):
        sampler.set_epoch(epoch)
        _seed_all(cfg.seed, epoch, rank)
        ddp_model.train()
        loss_sum, n_seen, t0 = torch.zeros((), device=device), 0, time.perf_counter()
        batches = iter(loader)
        for i in range(steps_per_epoch):
            x, y = next(batches)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if mixup is not None:
                x, y = mixup(x, y)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = criterion(ddp_model(x), y)
            (scaler.scale(loss) if scaler else loss).backward()
            optimizer_step(optimizer, scaler, model.parameters(), cfg.clip_grad)
            step += 1
            scheduler.step_update(step)
            loss_sum += loss.detach().float()
            n_seen += x.shape[0]
            if rank == 0 and (step % cfg.log_every == 0 or i + 1 == steps_per_epoch):
                rate = n_seen * world / (time.perf_counter() - t0)
                eta = (total_steps - step) * cfg.batch_size / rate
                log.info(f"[{kind}] epoch {epoch + 1}/{cfg.epochs} step {step}/{total_steps} loss {loss.item():.4f} "
                         f"lr {optimizer.param_groups[0]['lr']:.2e} {rate:.1f} img/s ETA {eta / 60:.1f} min")
        epoch_time = time.perf_counter() - t0
        stats = session.all_reduce(torch.tensor([loss_sum.item() / steps_per_epoch, n_seen], dtype=torch.float64))
        metrics = {"train_loss": stats[0].item() / world, "lr": max(g["lr"] for g in optimizer.param_groups),
                   "img_per_s": stats[1].item() / epoch_time, "epoch_time_s": epoch_time,
                   "epoch": epoch + 1, "step": step}
        evaluate = (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == last_epoch
        conf = None
        if evaluate:
            counts, conf = _evaluate(model, val_loader, n_classes, device, amp_dtype)
            counts, conf = session.all_reduce(counts), session.all_reduce(conf)
            metrics |= {"top1": 100 * counts[0].item() / counts[2].item(),
                        "top5": 100 * counts[1].item() / counts[2].item()}
            if rank == 0:
                log.info(f"[{kind}] epoch {epoch + 1}/{cfg.epochs} train loss {metrics['train_loss']:.4f} "
                         f"val top-1 {metrics['top1']:.2f}% top-5 {metrics['top5']:.2f}%")
        if rank == 0:
            registry.log_metrics(run_id, {k: v for k, v in metrics.items() if k != "epoch"}, epoch + 1, tracking)
        save = epoch + 1 == last_epoch or (epoch + 1) % cfg.checkpoint_every == 0
        with tempfile.TemporaryDirectory() as tmp:
            folder = None
            if save and rank == 0:
                folder = Path(tmp)
                save_checkpoint(folder, model, optimizer, scaler, epoch, step, cfg.to_dict())
                if conf is not None:
                    (folder / EVAL_FILE).write_text(json.dumps(
                        {"epoch": epoch + 1, "top1": metrics["top1"], "top5": metrics["top5"],
                         "classes": classes, "confusion": conf.tolist(), "img_size": img_size}))
            session.report(metrics, folder)


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker entry point (``TorchTrainer(train_loop_per_worker, train_loop_config=...)``)."""
    run_loop(FinetuneConfig.from_dict(config["cfg"]), config["run_id"], config["tracking_uri"], RaySession())


# ----------------------------------------------------------------------------------------------- the driver


def build_trainer(cfg: FinetuneConfig, run_id: str, tracking: str, callbacks: list | None = None):
    """The TorchTrainer of one fine-tune run (``callbacks``: e.g. Tune's ``TuneReportCallback``)."""
    return torch_trainer(train_loop_per_worker, {"cfg": cfg.to_dict(), "run_id": run_id, "tracking_uri": tracking},
                         num_workers=cfg.num_workers, use_gpu=cfg.use_gpu, cpus_per_worker=cfg.cpus_per_worker,
                         run_name=cfg.run_name, storage_path=cfg.storage_path, keep_checkpoints=cfg.keep_checkpoints,
                         max_failures=cfg.max_failures, callbacks=callbacks)


def _open_run(cfg: FinetuneConfig, ref: EncoderRef, kind: str, tracking: str) -> str:
    """The MLflow run id of a named run: the stored one when continuing, else a new run."""
    meta = read_run_meta(cfg.storage_path, cfg.run_name)
    if meta is None:
        run_id = registry.create_run(cfg.experiment, cfg.run_name, cfg.to_dict(), run_tags(ref, kind, cfg.data),
                                     tracking)
        registry.log_text(run_id, json.dumps(cfg.to_dict(), indent=2), "config/finetune.json", tracking)
        write_run_meta(cfg.storage_path, cfg.run_name, {"run_id": run_id, "config": cfg.to_dict()})
        return run_id
    stored = {k: v for k, v in meta["config"].items() if k not in RESUMABLE}
    wanted = {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE}
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ConfigError(
            f"run_name={cfg.run_name!r} already exists under {cfg.storage_path} with a different config "
            f"({', '.join(changed)}); re-run it with the stored config "
            f"({cfg.storage_path}/{cfg.run_name}/ropim_run.json) to continue, or pick a new run_name"
        )
    c = registry.client(tracking)
    if c.get_run(meta["run_id"]).info.status == "FINISHED":
        return meta["run_id"]
    c.update_run(meta["run_id"], status="RUNNING")
    print(f"[{kind}] continuing run {cfg.run_name} (MLflow run {meta['run_id']})", flush=True)
    return meta["run_id"]


def _fit(cfg: FinetuneConfig, run_id: str, tracking: str) -> tuple[dict, contextlib.AbstractContextManager | None]:
    """Run the loop (Ray Train or in-process); return the last metrics and a context giving the final folder."""
    if cfg.num_workers == 0:
        session = LocalSession(cfg)
        run_loop(cfg, run_id, tracking, session)
        latest = session.latest
        return session.metrics, (contextlib.nullcontext(str(latest)) if latest else None)
    with ray_session():
        result = build_trainer(cfg, run_id, tracking).fit()
    checkpoint = result.checkpoint
    return dict(result.metrics or {}), (checkpoint.as_directory() if checkpoint else None)


def _finish(cfg: FinetuneConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str, kind: str) -> dict:
    """Log per-class accuracy + confusion matrix, register the classifier, tag the encoder version."""
    name = dataset_name(cfg.data)
    ev = json.loads((folder / EVAL_FILE).read_text())
    report = log_results(run_id, ev["confusion"], ev["classes"], tracking, step=ev["epoch"],
                         title=f"{kind} of {ref.label} on {name}: top-1 {ev['top1']:.2f}%")
    registry.log_metrics(run_id, {"final_top1": ev["top1"], "final_top5": ev["top5"]}, ev["epoch"], tracking)
    out = {"per_class_top1": dict(zip(ev["classes"], report["per_class_top1"], strict=True)), "classifier_uri": None}
    if cfg.registered_model and not cfg.random_init:
        config = classifier_config(ref, ev["classes"], ev["img_size"], name, ev)
        uri = registry.register_classifier(run_id, load_file(str(folder / "model.safetensors")), config,
                                           cfg.registered_model, tracking)
        registry.set_tags(run_id, {"ropim.classifier_uri": uri}, tracking)
        print(f"[{kind}] registered classifier {uri}", flush=True)
        out["classifier_uri"] = uri
    if not cfg.random_init:
        tag_version(ref, {f"downstream.{name}.top1": ev["top1"]}, tracking)
    return out


def finetune(cfg: FinetuneConfig) -> dict[str, object]:
    """Fine-tune a classifier from ``cfg.encoder`` (or its architecture at random init); return val metrics:
    'top1', 'top5', 'train_loss', 'epoch', 'run_id', 'classifier_uri', 'per_class_top1'."""
    ensure_logging()
    cfg.validate()
    tracking = registry.tracking_uri()
    registry.check_tracking(tracking)
    ref, _ = resolve_encoder(cfg.encoder, tracking)
    data = resolved_data(cfg.data)
    img_size = cfg.img_size or ref.config["img_size"]
    eval_split(ref, data, img_size)  # image size and channels checked against the encoder
    n_train = len(build_dataset(data, "train", None, img_size))
    if n_train < cfg.batch_size:
        raise ConfigError(f"batch_size={cfg.batch_size} exceeds the training split ({n_train} images)")
    kind = "random-init" if cfg.random_init else "finetune"
    run_name = cfg.run_name or f"{kind}-{dataset_name(data)}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    cfg = dataclasses.replace(cfg, encoder=ref.pinned, data=data, run_name=run_name)
    run_id = _open_run(cfg, ref, kind, tracking)
    run = registry.client(tracking).get_run(run_id)
    if run.info.status == "FINISHED":  # a finished named run: report it, train nothing
        print(f"[{kind}] run {cfg.run_name} already finished (MLflow run {run_id}): top-1 "
              f"{run.data.metrics.get('top1', float('nan')):.2f}%", flush=True)
        return {**run.data.metrics, "epoch": cfg.epochs, "run_id": run_id, "run_name": cfg.run_name,
                "classifier_uri": run.data.tags.get("ropim.classifier_uri")}
    where = "in this process" if cfg.num_workers == 0 else f"on {cfg.num_workers} Ray Train workers"
    source = f"random init, architecture of {ref.label}" if cfg.random_init else ref.label
    print(f"[{kind}] run {cfg.run_name} {where}: {source} on {dataset_name(data)} at {img_size}px, "
          f"MLflow run {run_id}", flush=True)
    try:
        metrics, final = _fit(cfg, run_id, tracking)
        extra = {}
        if metrics.get("epoch") == cfg.epochs and final is not None:
            with final as d:
                extra = _finish(cfg, ref, run_id, Path(d), tracking, kind)
    except BaseException:
        registry.end_run(run_id, "FAILED", tracking)
        raise
    if metrics.get("epoch") != cfg.epochs:
        registry.end_run(run_id, "KILLED", tracking)
        print(f"[{kind}] stopped after epoch {metrics.get('epoch')}/{cfg.epochs}; continue by re-running with "
              f"--run_name {cfg.run_name}", flush=True)
    else:
        registry.end_run(run_id, "FINISHED", tracking)
    return {**metrics, **extra, "run_id": run_id, "run_name": cfg.run_name}
