"""LGP-ROPIM's second stage: MoCo v3 grafted onto a registered encoder (Layer Grafted Pre-training, Jiang et al.,
ICLR 2023) — the task the training loop runs, and the job that checks the encoder, opens the run, trains and
registers the result as a new encoder version tagged ``stage: lgp``.

``GraftTask`` gives the loop ``ropim.core.moco.MoCo`` around the encoder (both branches start from its weights),
AdamW over LGP's parameter groups (the embedding and lower blocks at ``lower_lr_ratio`` × the rate), MoCo v3's two
views, and a loss that first moves the momentum branch — once per optimizer step, at the momentum the step's index
gives (``momentum_at``), so a resumed run continues the schedule exactly: the momentum branch is a submodule, saved
in the checkpoint's ``model.safetensors``, and the step is the loop's. Negatives are the keys of every worker.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, DistributedSampler

from ropim.console import ensure_logging
from ropim.core.backbone import create_encoder
from ropim.core.contrastive import momentum_at
from ropim.core.moco import MoCo, lgp_param_groups
from ropim.data.datasets import build_dataset
from ropim.data.sources import check_batch_fits
from ropim.data.views import TwoViews
from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef, resolve_encoder
from ropim.tracking.names import default_run_name
from ropim.tracking.runs import open_run
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.downstream import dataset_name, eval_split, frozen_scores, run_tags
from ropim.train.graft_config import GraftConfig
from ropim.train.loop import train
from ropim.train.runtime import FitResult, WorkerFn, fit, run_dir
from ropim.train.speed import adamw_kernels, images_to
from ropim.train.task import EpochData, Worker

log = logging.getLogger("ropim.train")


def encoder_depth(state: dict[str, torch.Tensor]) -> int:
    """The number of blocks of an encoder state dict."""
    return 1 + max((int(k.split(".")[1]) for k in state if k.startswith("blocks.")), default=-1)


class GraftTask:
    """The graft as the loop sees it."""

    loss_name = "loss"

    def __init__(self, config: dict, worker: Worker) -> None:
        self.config = config["cfg"]
        self.cfg = GraftConfig.from_dict(self.config)
        self.run_id, self.tracking, self.run_dir = config["run_id"], config["tracking_uri"], config["run_dir"]
        self.worker = worker
        self.state, self.enc_cfg = registry.load_encoder_files(self.cfg.encoder, self.tracking)
        self.img_size = self.enc_cfg["img_size"]
        self.m, self.moved_at, self.total_steps = self.cfg.momentum, -1, 1

    def build(self, worker: Worker) -> tuple[MoCo, torch.optim.Optimizer]:
        cfg = self.cfg
        encoder = create_encoder(self.enc_cfg["arch"], self.enc_cfg["timm_kwargs"], drop_path_rate=cfg.drop_path)
        encoder.load_state_dict(self.state)
        model = MoCo(encoder, cfg.proj_dim, cfg.mlp_dim, cfg.temperature, cfg.freeze_patch_embed).to(worker.device)
        if worker.device.type == "cuda" and worker.world > 1:  # MoCo v3: batch statistics over all GPUs
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        groups = lgp_param_groups(model, cfg.split(encoder_depth(self.state)), cfg.lower_lr_ratio, cfg.weight_decay)
        self.model = model
        return model, torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), **adamw_kernels(cfg.adamw))

    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        cfg = self.cfg
        dataset = build_dataset(cfg.data, "train", TwoViews(self.img_size, cfg.crop_min), self.img_size)
        sampler = DistributedSampler(dataset, num_replicas=worker.world, rank=worker.rank, shuffle=True, seed=cfg.seed,
                                     drop_last=True)
        loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True,
                            num_workers=cfg.dataloader_workers, persistent_workers=cfg.dataloader_workers > 0,
                            pin_memory=worker.device.type == "cuda" and cfg.pin_memory)
        steps = len(loader) // cfg.accum_steps
        self.total_steps = cfg.epochs * cfg.loop().steps_per_epoch(steps)  # the loop's count: K of the schedule

        def batches(epoch: int):
            sampler.set_epoch(epoch)
            return iter(loader)

        return EpochData(batches, steps, {"momentum": (lambda: self.m, "max"),
                                          "bad_images": (lambda: getattr(getattr(dataset, "bad", None), "count", 0),
                                                         "sum")})

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        views = [images_to(x, self.worker.device, self.cfg.channels_last, non_blocking=self.cfg.pin_memory)
                 for x in batch[0]]
        if step != self.moved_at:  # the first micro batch of optimizer step ``step``
            self.m = momentum_at(step, self.total_steps, self.cfg.momentum, self.cfg.momentum_cosine)
            self.model.update_momentum(self.m)
            self.moved_at = step
        return model(*views), views[0].shape[0]

    def evaluate(self, model: MoCo, epoch: int, final: bool) -> dict[str, float]:
        if self.worker.rank != 0:
            return {}
        cfg = self.cfg
        return frozen_scores(model.encoder, self.img_size, cfg.data, cfg.knn_k, linear=cfg.eval_linear_probe)

    def evaluations(self, wait: bool) -> list[dict]:
        return []  # every evaluation is inline

    def epoch_end(self, model: MoCo, metrics: dict) -> None:
        cfg, epoch = self.cfg, metrics["epoch"]
        quality = "".join(f" {k} {metrics[k]:.2f}%" for k in ("knn_top1", "linear_top1") if k in metrics)
        log.info(f"[graft] epoch {epoch}/{cfg.epochs} loss {metrics['loss']:.4f} momentum {metrics['momentum']:.5f} "
                 f"{metrics['img_per_s']:.1f} img/s {metrics['epoch_time_s']:.1f} s{quality} "
                 f"ETA {(cfg.epochs - epoch) * metrics['epoch_time_s'] / 60:.1f} min")

    def record(self, epochs: list[dict]) -> None:
        store.log_epochs(self.run_id, epochs, self.tracking)

    def checkpoint_extra(self) -> dict:
        return {}


def worker_main(config: dict, worker: Worker) -> None:
    """One worker of a graft."""
    task = GraftTask(config, worker)
    train(task, task.cfg.loop(), worker)


@dataclass(frozen=True)
class GraftResult:
    """Where a graft left its outputs; ``encoder_uri`` is None while the run is unfinished."""

    run_id: str
    run_name: str
    encoder_uri: str | None
    checkpoint_path: str | None
    metrics: dict


def source_run(ref: EncoderRef, tracking: str) -> str:
    """The MLflow run that trained the encoder ``ref`` (its first stage), or "" for a plain folder."""
    if ref.version is not None:
        return store.client(tracking).get_model_version(ref.name, ref.version).run_id or ""
    if ref.pinned.startswith("runs:/"):
        return ref.pinned.removeprefix("runs:/").split("/", 1)[0]
    return ""


def prepare(cfg: GraftConfig, tracking: str) -> tuple[GraftConfig, EncoderRef]:
    """Validate ``cfg`` and check the encoder (its depth against the split, its image size and channels against
    the data), before any run starts; pin the encoder and the split."""
    cfg = cfg.resolved().validate()
    cfg.check_resources()
    ref, state = resolve_encoder(cfg.encoder, tracking)
    lower = cfg.split(encoder_depth(state))
    eval_split(ref, cfg.data, ref.config["img_size"])
    check_batch_fits(cfg.data, {"global_batch_size": cfg.global_batch_size})
    name = cfg.run_name or default_run_name(f"graft-{dataset_name(cfg.data)}")
    return dataclasses.replace(cfg, encoder=ref.pinned, lower_blocks=lower, run_name=name), ref


def grafted_config(cfg: GraftConfig, ref: EncoderRef, first_run: str) -> dict:
    """The registered config of a grafted encoder: the first stage's, plus what the graft did and where it began."""
    return {**ref.config, "stage": "lgp", "source_encoder": ref.pinned, "source_run": first_run,
            "graft_epochs": cfg.epochs, "graft_dataset": dataset_name(cfg.data), "lower_blocks": cfg.lower_blocks,
            "lower_lr_ratio": cfg.lower_lr_ratio, "temperature": cfg.temperature, "momentum": cfg.momentum}


def register_graft(folder: Path, cfg: GraftConfig, ref: EncoderRef, run_id: str, tracking: str) -> str:
    """Register the encoder of a final graft checkpoint (the base encoder only); return its URI."""
    state = load_file(str(folder / "model.safetensors"))
    encoder = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    config = grafted_config(cfg, ref, source_run(ref, tracking))
    return registry.register_encoder(run_id, encoder, config, cfg.registered_model, tracking)


def graft(cfg: GraftConfig, *, worker_fn: WorkerFn = worker_main, **trainer_kwargs) -> GraftResult:
    """Validate, train (or continue) the graft, register the grafted encoder; re-running a finished run reports it.
    ``trainer_kwargs`` go to the TorchTrainer (e.g. ``callbacks=[TuneReportCallback()]`` inside a Ray Tune trial)."""
    ensure_logging()
    tracking = tracking_uri()
    check_tracking(tracking)
    cfg, ref = prepare(cfg, tracking)
    with open_run(experiment=cfg.experiment, name=cfg.run_name, storage_path=cfg.storage_path, config=cfg.to_dict(),
                  resumable=GraftConfig.RESUMABLE, tags=run_tags(ref, "graft", cfg.data),
                  config_artifact="config/graft.json",
                  uri=tracking, normalize=lambda stored: GraftConfig.from_dict(stored).resolved().to_dict(),
                  resume=f"the same command, with --run_name {cfg.run_name}") as run:
        if run.finished:
            uri = run.meta.get("encoder_uri")
            print(f"[graft] run {cfg.run_name} already finished (MLflow run {run.run_id}); encoder {uri}", flush=True)
            return GraftResult(run.run_id, cfg.run_name, uri, run.meta.get("checkpoint"), run.meta.get("metrics", {}))
        where = "in this process" if cfg.num_workers == 0 else f"on {cfg.num_workers} Ray Train workers"
        n = cfg.lower_blocks
        lower = "the embedding" + (f" and blocks 0-{n - 1}" if n > 1 else " and block 0" if n else "")
        print(f"[graft] run {cfg.run_name} {where}: MoCo v3 on {ref.label}, {lower} at {cfg.lower_lr_ratio:g} x lr, "
              f"data {dataset_name(cfg.data)}, MLflow run {run.run_id}", flush=True)
        result = fit(worker_fn, {"cfg": cfg.to_dict(), "run_id": run.run_id, "tracking_uri": tracking,
                                 "run_dir": run_dir(cfg)}, cfg, **trainer_kwargs)
        return finish(cfg, ref, run, result)


def finish(cfg: GraftConfig, ref: EncoderRef, run, result: FitResult) -> GraftResult:
    """Register the encoder of a completed graft, or mark the run stopped; record the outcome."""
    uri = None
    if result.metrics.get("epoch") == cfg.epochs and result.checkpoint is not None:
        if cfg.registered_model:
            with result.checkpoint_dir() as folder:
                uri = register_graft(folder, cfg, ref, run.run_id, run.tracking_uri)
            store.set_tags(run.run_id, {"ropim.grafted_encoder_uri": uri}, run.tracking_uri)
        run.save(encoder_uri=uri, checkpoint=result.checkpoint_path, metrics=result.metrics)
        print(f"[graft] registered encoder {uri} (stage lgp, grafted onto {ref.label})" if uri else
              f"[graft] finished, not registered (registered_model=''): {result.checkpoint_path}", flush=True)
    else:
        run.stop()
        print(f"[graft] stopped after epoch {result.metrics.get('epoch')}/{cfg.epochs}; continue by re-running with "
              f"--run_name {cfg.run_name}", flush=True)
    return GraftResult(run.run_id, cfg.run_name, uri, result.checkpoint_path, result.metrics)
