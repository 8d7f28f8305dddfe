"""LGP-ROPIM's second stage: MoCo v3 grafted onto a registered encoder (Layer Grafted Pre-training, Jiang et al.,
ICLR 2023), as the training loop runs it.

``GraftTask`` gives the loop ``ropim.core.moco.MoCo`` around the encoder (both branches start from its weights),
AdamW over LGP's parameter groups (the embedding and lower blocks at ``lower_lr_ratio`` × the rate), MoCo v3's two
views, and a ``before_step`` hook that moves the momentum branch — once per optimizer step, at the momentum the
step's index gives (``momentum_at``), so a resumed run continues the schedule exactly: the momentum branch is a
submodule, saved in the checkpoint's ``model.safetensors``, and the step is the loop's. Negatives are the keys of
every worker.
"""

from __future__ import annotations

import torch

from ropim.core.backbone import create_encoder
from ropim.core.contrastive import momentum_at
from ropim.core.moco import MoCo, lgp_param_groups
from ropim.data.datasets import build_dataset
from ropim.data.views import TwoViews
from ropim.tracking.encoders import encoder_depth
from ropim.train.downstream import frozen_scores
from ropim.train.graft.config import GraftConfig
from ropim.train.speed import adamw_kernels, images_to
from ropim.train.task import EncoderTask, EpochData, Worker, bad_images, percents


class GraftTask(EncoderTask):
    """The graft as the loop sees it."""

    CONFIG = GraftConfig

    def __init__(self, config: dict, worker: Worker) -> None:
        super().__init__(config, worker)
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
        return self.sharded(dataset, micro_batch,
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
        cfg, kind = self.cfg, f"[graft] epoch {epoch} kNN"  # every worker extracts its share; rank 0 gets the scores
        return frozen_scores(model.encoder, self.img_size, progress=kind, worker=self.worker, **cfg.scores_options())

    def epoch_end(self, model: MoCo, metrics: dict) -> None:
        self.log_epoch(metrics, f"loss {metrics['loss']:.4f}", f"momentum {metrics['momentum']:.5f}",
                       *percents(metrics, "knn_top1", "linear_top1"))
