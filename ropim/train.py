"""ROPIM pretraining on Ray Train: the per-worker loop, the TorchTrainer wiring, checkpoints.

``pretrain(cfg)`` validates everything, opens an MLflow run, runs ``train_loop_per_worker`` on
``cfg.num_workers`` workers, then registers the final encoder and returns its ``models:/`` URI.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler

from ropim import registry
from ropim.data import DataConfig, build_dataset, pretrain_transform
from ropim.errors import ConfigError
from ropim.model import ROPIM, ModelConfig, encoder_kwargs

log = logging.getLogger("ropim.train")


@dataclass(frozen=True)
class PretrainConfig:
    """Everything one pretraining run needs; ``ropim pretrain --help`` lists it."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(img_size=32, patch_size=4))
    data: DataConfig = field(default_factory=DataConfig)
    epochs: int = 10
    global_batch_size: int = 128
    base_lr: float = 1e-3  # lr = base_lr × global_batch_size / 512
    min_lr: float = 1e-6
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    beta2: float = 0.95
    num_workers: int = 2
    use_gpu: bool = False
    seed: int = 0
    checkpoint_every: int = 0  # epochs between checkpoints; 0 = only the final one
    max_steps_per_epoch: int | None = None  # cap for smoke runs
    log_every: int = 10  # steps between progress lines
    experiment: str = "ropim-pretrain"
    run_name: str | None = None
    storage_path: str = "ray_results"
    registered_model: str = registry.DEFAULT_ENCODER_NAME

    def validate(self) -> PretrainConfig:
        """Raise ConfigError naming the bad field and its fix, before any Ray or MLflow work."""
        self.model.validate()
        self.data.validate()
        for name in ("epochs", "global_batch_size", "num_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if self.global_batch_size % self.num_workers:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not divisible by num_workers={self.num_workers}"
            )
        if self.base_lr <= 0:
            raise ConfigError(f"base_lr={self.base_lr}: must be > 0")
        return self

    @property
    def lr(self) -> float:
        """Peak learning rate after the linear scaling rule."""
        return self.base_lr * self.global_batch_size / 512

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PretrainConfig:
        d = dict(d)
        d["model"] = ModelConfig(**d.get("model", {}))
        d["data"] = DataConfig(**d.get("data", {}))
        return cls(**d)


def encoder_config(cfg: PretrainConfig, embed_dim: int) -> dict:
    """The JSON config stored beside a registered encoder."""
    m = cfg.model
    return {
        "arch": m.arch, "img_size": m.img_size, "patch_size": m.patch_size, "in_chans": m.in_chans,
        "embed_dim": embed_dim, "depth": m.depth, "rho": m.rho, "corruption": m.corruption, "loss": m.loss,
        "epochs": cfg.epochs, "dataset": cfg.data.source, "timm_kwargs": encoder_kwargs(m),
    }


def sketch_generator(seed: int, step: int, rank: int, device: torch.device) -> torch.Generator:
    """The generator of step ``step`` on ``rank``: sketches are reproducible from (seed, step, rank)."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + rank) * 1_000_000_007 + step)


def save_checkpoint(folder: Path, model: ROPIM, optimizer, epoch: int, step: int, cfg: PretrainConfig) -> None:
    """Model weights as safetensors, optimizer and counters as a tensor-only torch file, the config."""
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "epoch": epoch, "step": step}, folder / "train_state.pt")
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker: pretrain ROPIM; rank 0 logs to MLflow and writes checkpoints."""
    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader

    cfg = PretrainConfig.from_dict(config["cfg"])
    run_id, tracking = config["run_id"], config["tracking_uri"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)

    model = ROPIM(cfg.model)
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                    betas=(0.9, cfg.beta2))
    start_epoch, step = 0, 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            model.load_state_dict(load_file(os.path.join(d, "model.safetensors")))
            state = torch.load(os.path.join(d, "train_state.pt"), weights_only=True)
        optimizer.load_state_dict(state["optimizer"])
        start_epoch, step = state["epoch"] + 1, state["step"]
    ddp_model = ray.train.torch.prepare_model(model)

    per_worker = cfg.global_batch_size // world
    dataset = build_dataset(cfg.data, "train", pretrain_transform(cfg.model.img_size), cfg.model.img_size)
    loader = DataLoader(dataset, batch_size=per_worker, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(cfg.seed))
    loader = ray.train.torch.prepare_data_loader(loader)
    steps_per_epoch = len(loader) if cfg.max_steps_per_epoch is None else min(len(loader), cfg.max_steps_per_epoch)
    total_steps = cfg.epochs * steps_per_epoch
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps, lr_min=cfg.min_lr,
                                  warmup_t=round(cfg.warmup_epochs * steps_per_epoch), warmup_lr_init=cfg.min_lr,
                                  t_in_epochs=False)
    scheduler.step_update(step)

    for epoch in range(start_epoch, cfg.epochs):
        if world > 1:
            loader.sampler.set_epoch(epoch)
        ddp_model.train()
        loss_sum, n_seen, t0 = torch.zeros((), device=device), 0, time.perf_counter()
        for i, (imgs, _) in enumerate(loader):
            if i == steps_per_epoch:
                break
            loss, _, _ = ddp_model(imgs, sketch_generator(cfg.seed, step, rank, device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            scheduler.step_update(step)
            loss_sum += loss.detach()
            n_seen += imgs.shape[0]
            if rank == 0 and (step % cfg.log_every == 0 or i + 1 == steps_per_epoch):
                elapsed = time.perf_counter() - t0
                rate = n_seen * world / elapsed
                eta = (total_steps - step) * cfg.global_batch_size / rate
                # logging, not print: Ray Train's print patch would echo each line twice
                log.info(f"[pretrain] epoch {epoch + 1}/{cfg.epochs} step {step}/{total_steps} "
                         f"loss {loss.item():.4f} {rate:.1f} img/s ETA {eta / 60:.1f} min")
        epoch_time = time.perf_counter() - t0
        mean_loss = loss_sum / steps_per_epoch
        if world > 1:
            torch.distributed.all_reduce(mean_loss)
            mean_loss /= world
        metrics = {
            "loss": mean_loss.item(), "lr": optimizer.param_groups[0]["lr"],
            "img_per_s": n_seen * world / epoch_time, "epoch_time_s": epoch_time,
            "epoch": epoch + 1, "step": step,
        }
        last = epoch + 1 == cfg.epochs
        save = last or (cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0)
        if rank == 0:
            registry.log_metrics(run_id, {k: v for k, v in metrics.items() if k != "epoch"}, epoch + 1, tracking)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if save and rank == 0:
                save_checkpoint(Path(tmp), model, optimizer, epoch, step, cfg)
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt)


@dataclass(frozen=True)
class PretrainResult:
    """Where a finished pretraining run left its outputs."""

    run_id: str
    encoder_uri: str
    checkpoint_path: str
    metrics: dict


def pretrain(cfg: PretrainConfig, config_text: str | None = None) -> PretrainResult:
    """Validate, run the TorchTrainer, register the final encoder; return its URI and the run id."""
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    cfg.validate()
    n_train = len(build_dataset(cfg.data, "train", img_size=cfg.model.img_size))
    if n_train < cfg.global_batch_size:
        raise ConfigError(f"global_batch_size={cfg.global_batch_size} exceeds the training split ({n_train} images)")
    uri = registry.tracking_uri()
    registry.check_tracking(uri)
    run_name = cfg.run_name or f"pretrain-{time.strftime('%Y%m%d-%H%M%S')}"
    cfg = dataclasses.replace(cfg, run_name=run_name)
    run_id = registry.create_run(cfg.experiment, run_name, cfg.to_dict(), {"ropim.kind": "pretrain"}, uri)
    registry.log_text(run_id, config_text or json.dumps(cfg.to_dict(), indent=2), "config/pretrain.yaml", uri)
    print(f"[pretrain] MLflow run {run_id} at {uri}", flush=True)
    started_ray = not ray.is_initialized()
    try:
        if started_ray:
            ray.init(include_dashboard=False)
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={"cfg": cfg.to_dict(), "run_id": run_id, "tracking_uri": uri},
            scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu),
            run_config=RunConfig(
                name=run_name,
                storage_path=str(Path(cfg.storage_path).absolute()),
                checkpoint_config=CheckpointConfig(num_to_keep=2),
            ),
        )
        result = trainer.fit()
        with result.checkpoint.as_directory() as d:
            state = load_file(os.path.join(d, "model.safetensors"))
        encoder_state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
        embed_dim = encoder_state["cls_token"].shape[-1]
        encoder_uri = registry.register_encoder(
            run_id, encoder_state, encoder_config(cfg, embed_dim), cfg.registered_model, uri
        )
    except BaseException:
        registry.end_run(run_id, "FAILED", uri)
        raise
    finally:
        if started_ray:
            ray.shutdown()
    registry.set_tags(run_id, {"ropim.encoder_uri": encoder_uri}, uri)
    registry.end_run(run_id, "FINISHED", uri)
    print(f"[pretrain] registered encoder {encoder_uri}", flush=True)
    return PretrainResult(run_id, encoder_uri, result.checkpoint.path, dict(result.metrics or {}))

