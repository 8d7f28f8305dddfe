"""ROPIM pretraining on Ray Train: the per-worker loop, the TorchTrainer wiring, resume and registration.

``pretrain(cfg)`` validates everything, opens (or re-opens) the MLflow run, runs ``train_loop_per_worker``
on ``cfg.num_workers`` workers, then registers the final encoder and returns its ``models:/`` URI.
Re-running a named run (same ``run_name`` and ``storage_path``) continues from its latest checkpoint with
the same step count, LR schedule and MLflow run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler

from ropim import registry
from ropim.checkpoint import load_checkpoint, read_run_meta, save_checkpoint, write_run_meta
from ropim.data import DataConfig, build_dataset, count_images, eval_transform, pretrain_transform
from ropim.errors import ConfigError
from ropim.model import ROPIM, ModelConfig, encoder_kwargs
from ropim.runtime import autocast_dtype, check_precision, grad_scaler, optimizer_step, ray_session, torch_trainer

log = logging.getLogger("ropim.train")
INGESTS = ("torch", "ray_data")
# Fields that may differ when a named run is continued; everything else must match the stored config.
RESUMABLE = ("num_workers", "use_gpu", "stop_after_epochs", "max_failures", "log_every", "cpus_per_worker")


@dataclass(frozen=True)
class PretrainConfig:
    """Everything one pretraining run needs; ``ropim pretrain --help`` lists it."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(img_size=32, patch_size=4))
    data: DataConfig = field(default_factory=DataConfig)
    epochs: int = 10
    global_batch_size: int = 128
    accum_steps: int = 1  # gradient accumulation: micro batch = global_batch_size / (num_workers × accum_steps)
    base_lr: float = 1e-3  # lr = base_lr × global_batch_size / 512
    min_lr: float = 1e-6
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    beta2: float = 0.95
    clip_grad: float | None = None  # max gradient norm; None = no clipping
    precision: str = "fp32"  # fp32 | bf16 (autocast) | fp16 (autocast + grad scaler, GPU only)
    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0  # with ingest=ray_data leave CPUs to Ray Data: 0.5 for 2 workers on 2 CPUs
    ingest: str = "torch"  # torch: a DataLoader per worker; ray_data: Ray Data decode/augment tasks, sharded
    seed: int = 0
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always checkpoints)
    keep_checkpoints: int = 2
    max_failures: int = 1  # worker-group restarts from the latest checkpoint before the run fails
    stop_after_epochs: int | None = None  # train this many epochs in this job, checkpoint, stop (resume later)
    max_steps_per_epoch: int | None = None  # cap for smoke runs
    eval_every: int = 0  # epochs between kNN top-1 evaluations on the val split (0 = never)
    eval_linear_probe: bool = False  # on eval epochs also fit a linear probe (ropim.probe defaults): linear_top1
    viz_every: int = 10  # epochs between reconstruction-grid PNGs logged to MLflow (0 = never; last epoch too)
    knn_k: int = 20
    log_every: int = 10  # steps between progress lines
    experiment: str = "ropim-pretrain"
    run_name: str | None = None
    storage_path: str = "ray_results"
    registered_model: str = registry.DEFAULT_ENCODER_NAME

    def validate(self) -> PretrainConfig:
        """Raise ConfigError naming the bad field and its fix, before any Ray or MLflow work."""
        self.model.validate()
        self.data.validate()
        for name in ("epochs", "global_batch_size", "num_workers", "accum_steps", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if self.global_batch_size % (self.num_workers * self.accum_steps):
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not divisible by num_workers={self.num_workers} "
                f"× accum_steps={self.accum_steps}"
            )
        if self.base_lr <= 0:
            raise ConfigError(f"base_lr={self.base_lr}: must be > 0")
        check_precision(self.precision, self.use_gpu)
        if self.ingest not in INGESTS:
            raise ConfigError(f"ingest={self.ingest!r}: choose one of {', '.join(INGESTS)}")
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
        "hashing": m.hashing, "mask_ratio": m.mask_ratio, "mask_patch_size": m.mask_patch_size,
        "epochs": cfg.epochs, "dataset": cfg.data.source, "timm_kwargs": encoder_kwargs(m),
    }


def _seed(seed: int, counter: int, rank: int) -> int:
    return (seed * 1_000_003 + rank) * 1_000_000_007 + counter


def sketch_generator(seed: int, step: int, rank: int, device: torch.device) -> torch.Generator:
    """The generator of step ``step`` on ``rank``: sketches are reproducible from (seed, step, rank)."""
    return torch.Generator(device=device).manual_seed(_seed(seed, step, rank))


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated GPU memory, or this process's peak resident memory on CPU, in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def quality_metrics(encoder: torch.nn.Module, cfg: PretrainConfig) -> dict[str, float]:
    """Label-based quality of ``encoder``'s frozen features on the val split (the train split is the memory
    bank / probe training set): ``knn_top1`` (%) and, with ``eval_linear_probe``, ``linear_top1`` (%)."""
    from ropim.evaluate import extract_features, knn_top1, linear_probe

    tf, size = eval_transform(cfg.model.img_size), cfg.model.img_size
    train = extract_features(encoder, build_dataset(cfg.data, "train", tf, size))
    val = extract_features(encoder, build_dataset(cfg.data, "val", tf, size))
    encoder.train()
    metrics = {"knn_top1": knn_top1(*train, *val, k=cfg.knn_k)}
    if cfg.eval_linear_probe:
        metrics["linear_top1"] = linear_probe(*train, *val, seed=cfg.seed)["top1"]
    return metrics


def log_pictures(run_id: str, tracking_uri: str, model: ROPIM, imgs: torch.Tensor, epoch: int, seed: int,
                 figure5: bool) -> None:
    """Reconstruction grid of ``imgs`` (paper Figs. 3/6/7) and, once, the Figure-5 token errors, as PNG artifacts."""
    from ropim import viz

    with tempfile.TemporaryDirectory() as tmp:
        grid = Path(tmp) / f"reconstruction_epoch{epoch:04d}.png"
        viz.save_reconstruction_grid(model, imgs, grid, torch.Generator().manual_seed(seed))
        registry.log_artifact(run_id, grid, "pictures", tracking_uri)
        if figure5:
            fig = Path(tmp) / "token_errors.png"
            viz.token_error_figure(viz.token_errors(imgs, model.cfg.patch_size), fig)
            registry.log_artifact(run_id, fig, "pictures", tracking_uri)


@dataclass
class EpochSource:
    """Where a worker's batches come from: ``batches(epoch)`` yields (images, labels) micro batches."""

    batches: Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]]
    steps_per_epoch: int  # optimizer steps per epoch (each of accum_steps micro batches)
    bad_images: Callable[[], float]  # images skipped so far: this worker's, or the dataset's when shared_count
    shared_count: bool = False  # ray_data: one counter for all workers (not summed over them)


def _epoch_source(cfg: PretrainConfig, config: dict, rank: int, world: int) -> EpochSource:
    """This worker's share of the training split: a Ray Data shard (ingest=ray_data) or a DataLoader."""
    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader, DistributedSampler

    micro_batch = cfg.global_batch_size // (world * cfg.accum_steps)
    if cfg.ingest == "ray_data":
        from ropim.ingest import bad_image_summary, iter_epoch

        shard = ray.train.get_dataset_shard("train")  # an equal split: every worker gets as many batches
        counter = config.get("bad_images")
        return EpochSource(
            batches=lambda epoch: iter_epoch(shard, micro_batch, epoch, seed=cfg.seed, rank=rank),
            steps_per_epoch=config["n_train"] // world // micro_batch // cfg.accum_steps,
            bad_images=lambda: bad_image_summary(counter)["count"] if counter is not None else 0,
            shared_count=True,
        )
    dataset = build_dataset(cfg.data, "train", pretrain_transform(cfg.model.img_size), cfg.model.img_size)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True)
    loader = ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False, move_to_device=True)

    def batches(epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        sampler.set_epoch(epoch)
        return iter(loader)

    return EpochSource(batches, len(loader) // cfg.accum_steps,
                       lambda: getattr(getattr(dataset, "bad", None), "count", 0))


@dataclass
class EpochTally:
    """What one worker measured in one epoch."""

    loss_sum: torch.Tensor  # sum over steps of the step's mean loss
    steps: int = 0
    images: int = 0
    wait_s: float = 0.0  # time spent waiting for the next batch
    time_s: float = 0.0


def _train_epoch(cfg: PretrainConfig, ddp_model, model: ROPIM, optimizer, scaler, scheduler, batches, *,
                 epoch: int, step: int, steps: int, total_steps: int, rank: int, world: int,
                 device: torch.device) -> tuple[EpochTally, int]:
    """Train ``steps`` optimizer steps (each over ``accum_steps`` micro batches); return the tally and the new
    global step. A fresh sketch generator per step from (seed, step, rank); progress lines from rank 0."""
    amp_dtype = autocast_dtype(cfg.precision)
    tally, t0 = EpochTally(torch.zeros((), device=device)), time.perf_counter()
    try:
        for i in range(steps):
            generator = sketch_generator(cfg.seed, step, rank, device)
            for micro in range(cfg.accum_steps):
                t_wait = time.perf_counter()
                imgs, _ = next(batches)
                tally.wait_s += time.perf_counter() - t_wait
                sync = micro + 1 == cfg.accum_steps or world == 1
                with ddp_model.no_sync() if not sync else contextlib.nullcontext(), \
                        torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                    loss, _, _ = ddp_model(imgs, generator)
                    scaled = loss / cfg.accum_steps
                    (scaler.scale(scaled) if scaler else scaled).backward()
                tally.loss_sum += loss.detach().float() / cfg.accum_steps
                tally.images += imgs.shape[0]
            optimizer_step(optimizer, scaler, model.parameters(), cfg.clip_grad)
            step += 1
            tally.steps += 1
            scheduler.step_update(step)
            if rank == 0 and (step % cfg.log_every == 0 or i + 1 == steps):
                rate = tally.images * world / (time.perf_counter() - t0)
                eta = (total_steps - step) * cfg.global_batch_size / rate
                # logging, not print: Ray Train's print patch would echo each line twice
                log.info(f"[pretrain] epoch {epoch + 1}/{cfg.epochs} step {step}/{total_steps} "
                         f"loss {loss.item():.4f} {rate:.1f} img/s ETA {eta / 60:.1f} min")
    except StopIteration:  # ray_data: skipped bad images left fewer (equal-split) batches than listed
        pass
    tally.time_s = time.perf_counter() - t0
    return tally, step


def _epoch_stats(tally: EpochTally, source: EpochSource, device: torch.device, world: int) -> dict[str, float]:
    """The epoch's metrics over all workers: mean loss and wait share, total img/s and bad images, slowest epoch
    time, peak memory."""
    stats = torch.tensor([tally.loss_sum.item() / max(tally.steps, 1), tally.images, tally.time_s,
                          peak_memory_mb(device), tally.wait_s / tally.time_s, source.bad_images()])
    if world > 1:
        gathered = [torch.zeros_like(stats) for _ in range(world)]
        torch.distributed.all_gather(gathered, stats.to(device) if device.type == "cuda" else stats)
        g = torch.stack([t.cpu() for t in gathered])
        bad = g[:, 5].max() if source.shared_count else g[:, 5].sum()
        stats = torch.stack([g[:, 0].mean(), g[:, 1].sum(), g[:, 2].max(), g[:, 3].max(), g[:, 4].mean(), bad])
    loss, images, time_s, peak_mb, wait_share, bad_images = stats.tolist()
    return {"loss": loss, "img_per_s": images / time_s, "epoch_time_s": time_s, "peak_mem_mb": peak_mb,
            "bad_images": bad_images, "data_wait_share": wait_share}


def train_loop_per_worker(config: dict) -> None:
    """Ray Train worker: pretrain ROPIM; rank 0 logs to MLflow and writes checkpoints."""
    import ray.train
    import ray.train.torch

    cfg = PretrainConfig.from_dict(config["cfg"])
    run_id, tracking = config["run_id"], config["tracking_uri"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank

    model = ROPIM(cfg.model).to(device)
    optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, cfg.beta2))
    scaler = grad_scaler(cfg.precision)
    start_epoch, step = 0, 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = load_checkpoint(d, model, optimizer, scaler)
        start_epoch, step = state["epoch"] + 1, state["step"]
        if rank == 0:
            log.info(f"[pretrain] resumed from epoch {start_epoch}, step {step}")
    ddp_model = ray.train.torch.prepare_model(model, move_to_device=False)

    source = _epoch_source(cfg, config, rank, world)
    steps_per_epoch = source.steps_per_epoch
    if cfg.max_steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, cfg.max_steps_per_epoch)
    total_steps = cfg.epochs * steps_per_epoch
    scheduler = CosineLRScheduler(optimizer, t_initial=total_steps, lr_min=cfg.min_lr,
                                  warmup_t=round(cfg.warmup_epochs * steps_per_epoch), warmup_lr_init=cfg.min_lr,
                                  t_in_epochs=False)
    scheduler.step_update(step)
    last_epoch = cfg.epochs if cfg.stop_after_epochs is None else min(cfg.epochs, start_epoch + cfg.stop_after_epochs)
    if rank == 0 and cfg.viz_every:
        from ropim.viz import validation_images

        viz_imgs = validation_images(cfg.data, cfg.model.img_size)  # the same few val images every time

    for epoch in range(start_epoch, last_epoch):
        torch.manual_seed(_seed(cfg.seed, epoch, rank))  # augmentation and drop path
        ddp_model.train()
        tally, step = _train_epoch(cfg, ddp_model, model, optimizer, scaler, scheduler, source.batches(epoch),
                                   epoch=epoch, step=step, steps=steps_per_epoch, total_steps=total_steps,
                                   rank=rank, world=world, device=device)
        metrics = {**_epoch_stats(tally, source, device, world), "lr": optimizer.param_groups[0]["lr"],
                   "epoch": epoch + 1, "step": step}
        if rank == 0 and cfg.eval_every and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
            metrics.update(quality_metrics(model.encoder, cfg))
        if rank == 0:
            quality = "".join(f" {k} {metrics[k]:.2f}%" for k in ("knn_top1", "linear_top1") if k in metrics)
            log.info(f"[pretrain] epoch {epoch + 1}/{cfg.epochs} loss {metrics['loss']:.4f} "
                     f"{metrics['img_per_s']:.1f} img/s data wait {100 * metrics['data_wait_share']:.1f}%"
                     f" {metrics['epoch_time_s']:.1f} s{quality}")
            registry.log_metrics(run_id, {k: v for k, v in metrics.items() if k != "epoch"}, epoch + 1, tracking)
            if cfg.viz_every and ((epoch + 1) % cfg.viz_every == 0 or epoch + 1 == cfg.epochs):
                log_pictures(run_id, tracking, model, viz_imgs, epoch + 1, cfg.seed, figure5=epoch + 1 == cfg.epochs)
        save = epoch + 1 == last_epoch or (epoch + 1) % cfg.checkpoint_every == 0
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if save and rank == 0:
                save_checkpoint(Path(tmp), model, optimizer, scaler, epoch, step, cfg.to_dict())
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report(metrics, checkpoint=ckpt)


@dataclass(frozen=True)
class PretrainResult:
    """Where a pretraining job left its outputs; ``encoder_uri`` is None while the run is unfinished."""

    run_id: str
    encoder_uri: str | None
    checkpoint_path: str
    metrics: dict


def build_trainer(cfg: PretrainConfig, run_id: str, tracking_uri: str, *,
                  train_loop: Callable[[dict], None] = train_loop_per_worker, callbacks: list | None = None,
                  storage_path: str | None = None):
    """The TorchTrainer of one pretraining run (also used inside Tune trials)."""
    storage = storage_path or cfg.storage_path
    loop_config = {"cfg": cfg.to_dict(), "run_id": run_id, "tracking_uri": tracking_uri,
                   "n_train": count_images(cfg.data, "train")}
    datasets = None
    if cfg.ingest == "ray_data":
        from ropim.ingest import build_ray_dataset, new_bad_image_counter

        loop_config["bad_images"] = new_bad_image_counter()
        datasets = {"train": build_ray_dataset(cfg.data, "train", cfg.model.img_size, shuffle_seed=cfg.seed,
                                               bad_images=loop_config["bad_images"])}
    return torch_trainer(train_loop, loop_config, num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                         cpus_per_worker=cfg.cpus_per_worker, run_name=cfg.run_name, storage_path=storage,
                         keep_checkpoints=cfg.keep_checkpoints, max_failures=cfg.max_failures, callbacks=callbacks,
                         datasets=datasets)


def register_checkpoint(checkpoint, cfg: PretrainConfig, run_id: str, tracking_uri: str) -> str:
    """Register the encoder held in a final Ray checkpoint (decoder logged beside it); return its URI."""
    with checkpoint.as_directory() as d:
        state = load_file(str(Path(d) / "model.safetensors"))
        decoder = {k: v for k, v in state.items() if not k.startswith("encoder.")}
        with tempfile.TemporaryDirectory() as tmp:
            save_file(decoder, str(Path(tmp) / "decoder.safetensors"))
            registry.log_artifact(run_id, Path(tmp) / "decoder.safetensors", "decoder", tracking_uri)
    encoder_state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    embed_dim = encoder_state["cls_token"].shape[-1]
    return registry.register_encoder(run_id, encoder_state, encoder_config(cfg, embed_dim), cfg.registered_model,
                                     tracking_uri)


def _open_run(cfg: PretrainConfig, uri: str, config_text: str | None) -> str:
    """The MLflow run id of a named run: the stored one when continuing, else a new run."""
    meta = read_run_meta(cfg.storage_path, cfg.run_name)
    if meta is None:
        run_id = registry.create_run(cfg.experiment, cfg.run_name, cfg.to_dict(), {"ropim.kind": "pretrain"}, uri)
        registry.log_text(run_id, config_text or json.dumps(cfg.to_dict(), indent=2), "config/pretrain.yaml", uri)
        write_run_meta(cfg.storage_path, cfg.run_name, {"run_id": run_id, "config": cfg.to_dict()})
        return run_id
    stored = {k: v for k, v in meta["config"].items() if k not in RESUMABLE}
    wanted = {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE}
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ConfigError(
            f"run_name={cfg.run_name!r} already exists under {cfg.storage_path} with a different config "
            f"({', '.join(changed)}); continue it with `ropim pretrain --resume {cfg.run_name}` or pick a new run_name"
        )
    registry.client(uri).update_run(meta["run_id"], status="RUNNING")
    print(f"[pretrain] continuing run {cfg.run_name} (MLflow run {meta['run_id']})", flush=True)
    return meta["run_id"]


def resume_config(run_name: str, storage_path: str = "ray_results", **resumable) -> PretrainConfig:
    """The stored config of run ``run_name``, trained to the end, with RESUMABLE fields replaced by ``resumable``."""
    meta = read_run_meta(storage_path, run_name)
    if meta is None:
        raise ConfigError(f"--resume {run_name}: no run of that name under storage_path={storage_path}")
    unknown = set(resumable) - set(RESUMABLE)
    if unknown:
        raise ConfigError(f"--resume: {', '.join(sorted(unknown))} cannot change when continuing a run")
    return dataclasses.replace(PretrainConfig.from_dict(meta["config"]), **{"stop_after_epochs": None, **resumable})


def pretrain(cfg: PretrainConfig, config_text: str | None = None, *,
             train_loop: Callable[[dict], None] = train_loop_per_worker) -> PretrainResult:
    """Validate, run (or continue) the TorchTrainer, register the final encoder; return its URI and the run id."""

    cfg.validate()
    n_train = count_images(cfg.data, "train")
    if n_train < cfg.global_batch_size:
        raise ConfigError(f"global_batch_size={cfg.global_batch_size} exceeds the training split ({n_train} images)")
    uri = registry.tracking_uri()
    registry.check_tracking(uri)
    cfg = dataclasses.replace(cfg, run_name=cfg.run_name or f"pretrain-{time.strftime('%Y%m%d-%H%M%S')}")
    run_id = _open_run(cfg, uri, config_text)
    print(f"[pretrain] run {cfg.run_name}: MLflow run {run_id} at {uri}", flush=True)
    try:
        with ray_session():
            result = build_trainer(cfg, run_id, uri, train_loop=train_loop).fit()
            metrics = dict(result.metrics or {})
            encoder_uri = None
            if metrics.get("epoch") == cfg.epochs:
                encoder_uri = register_checkpoint(result.checkpoint, cfg, run_id, uri)
    except BaseException:
        registry.end_run(run_id, "FAILED", uri)
        raise
    if encoder_uri is None:
        registry.end_run(run_id, "KILLED", uri)
        print(f"[pretrain] stopped after epoch {metrics.get('epoch')}/{cfg.epochs}; continue with "
              f"`ropim pretrain --resume {cfg.run_name}`", flush=True)
    else:
        registry.set_tags(run_id, {"ropim.encoder_uri": encoder_uri}, uri)
        registry.end_run(run_id, "FINISHED", uri)
        print(f"[pretrain] registered encoder {encoder_uri}", flush=True)
    return PretrainResult(run_id, encoder_uri, result.checkpoint.path, metrics)
