"""LGP-ROPIM's second stage: MoCo v3 grafted onto a registered encoder (Layer Grafted Pre-training, Jiang et al.,
ICLR 2023) — the task the training loop runs, and the register function that adds the result as a new encoder
version tagged ``stage: lgp`` (``ropim.train.driver`` runs the job: ``run(GraftConfig(...))``).

``GraftTask`` gives the loop ``ropim.core.moco.MoCo`` around the encoder (both branches start from its weights),
AdamW over LGP's parameter groups (the embedding and lower blocks at ``lower_lr_ratio`` × the rate), MoCo v3's two
views, and a ``before_step`` hook that moves the momentum branch — once per optimizer step, at the momentum the
step's index gives (``momentum_at``), so a resumed run continues the schedule exactly: the momentum branch is a
submodule, saved in the checkpoint's ``model.safetensors``, and the step is the loop's. Negatives are the keys of
every worker.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from safetensors.torch import load_file

from ropim.core.backbone import create_encoder
from ropim.core.contrastive import momentum_at
from ropim.core.moco import MoCo, lgp_param_groups
from ropim.data.datasets import build_dataset
from ropim.data.views import TwoViews
from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef, encoder_depth
from ropim.train.downstream import frozen_scores
from ropim.train.graft_config import GraftConfig
from ropim.train.job import dataset_name
from ropim.train.speed import adamw_kernels, images_to
from ropim.train.task import EpochData, Task, Worker, bad_images

log = logging.getLogger("ropim.train")


class GraftTask(Task):
    """The graft as the loop sees it."""

    CONFIG = GraftConfig

    def __init__(self, config: dict, worker: Worker) -> None:
        super().__init__(config, worker)
        self.state, self.enc_cfg = registry.load_encoder_files(self.cfg.encoder, self.tracking)
        self.img_size = self.enc_cfg["img_size"]
        self.m = self.cfg.momentum

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
        dataset = build_dataset(self.cfg.data, "train", TwoViews(self.img_size, self.cfg.crop_min), self.img_size)
        return self.sharded(dataset, micro_batch, self.cfg.dataloader_workers,
                            {"momentum": (lambda: self.m, "max"), "bad_images": bad_images(dataset)})

    def before_step(self, step: int) -> None:
        """Move the momentum branch, once per optimizer step, at the momentum of ``step`` (of ``total_steps``)."""
        self.m = momentum_at(step, self.total_steps, self.cfg.momentum, self.cfg.momentum_cosine)
        self.model.update_momentum(self.m)

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        views = [images_to(x, self.worker.device, self.cfg.channels_last, non_blocking=self.cfg.pin_memory)
                 for x in batch[0]]
        return model(*views), views[0].shape[0]

    def evaluate(self, model: MoCo, epoch: int, final: bool) -> dict[str, float]:
        if self.worker.rank != 0:
            return {}
        cfg = self.cfg
        return frozen_scores(model.encoder, self.img_size, cfg.data, cfg.knn_k, linear=cfg.eval_linear_probe)

    def epoch_end(self, model: MoCo, metrics: dict) -> None:
        cfg, epoch = self.cfg, metrics["epoch"]
        quality = "".join(f" {k} {metrics[k]:.2f}%" for k in ("knn_top1", "linear_top1") if k in metrics)
        log.info(f"[graft] epoch {epoch}/{cfg.epochs} loss {metrics['loss']:.4f} momentum {metrics['momentum']:.5f} "
                 f"{metrics['img_per_s']:.1f} img/s {metrics['epoch_time_s']:.1f} s{quality} "
                 f"ETA {(cfg.epochs - epoch) * metrics['epoch_time_s'] / 60:.1f} min")


def source_run(ref: EncoderRef, tracking: str) -> str:
    """The MLflow run that trained the encoder ``ref`` (its first stage), or "" for a plain folder."""
    if ref.version is not None:
        return store.client(tracking).get_model_version(ref.name, ref.version).run_id or ""
    if ref.pinned.startswith("runs:/"):
        return ref.pinned.removeprefix("runs:/").split("/", 1)[0]
    return ""


def grafted_config(cfg: GraftConfig, ref: EncoderRef, first_run: str) -> dict:
    """The registered config of a grafted encoder: the first stage's, plus what the graft did and where it began."""
    return {**ref.config, "stage": "lgp", "source_encoder": ref.pinned, "source_run": first_run,
            "graft_epochs": cfg.epochs, "graft_dataset": dataset_name(cfg.data), "lower_blocks": cfg.lower_blocks,
            "lower_lr_ratio": cfg.lower_lr_ratio, "temperature": cfg.temperature, "momentum": cfg.momentum}


def register_graft(cfg: GraftConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> str | None:
    """The job's register function (``ropim.train.jobs``): the encoder of the final graft checkpoint ``folder`` (the
    base encoder only) as a new version with its lineage, unless ``registered_model`` is ""."""
    if not cfg.registered_model:
        return None
    state = load_file(str(folder / "model.safetensors"))
    encoder = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    config = grafted_config(cfg, ref, source_run(ref, tracking))
    return registry.register_encoder(run_id, encoder, config, cfg.registered_model, tracking)


