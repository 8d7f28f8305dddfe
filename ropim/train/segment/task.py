"""Semantic segmentation transfer (the paper's Table 3 protocol) as the training loop runs it.

``SegmentTask`` supplies the loop with UperNet on the encoder (``ropim.core.segmenter``: layer-wise lr decay over
the encoder's blocks, the decoder at the full rate), the joint image + mask augmentation, cross-entropy with the
auxiliary head's loss weighted by ``aux_weight``, and the val evaluation (whole-image or sliding-window, the pixel
confusion matrix summed over the workers: mIoU, pixel accuracy, per-class IoU; the last one is kept for
``register.py``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import torch
from timm.optim import create_optimizer_v2
from torch.utils.data import DataLoader, Subset

from ropim.core.segmenter import seg_loss, segmenter_from_encoder
from ropim.data.pair_lists import IGNORE
from ropim.data.sampling import contiguous_share, dealt
from ropim.data.seg_datasets import build_seg_dataset, seg_eval_transform, seg_train_transform
from ropim.data.sources import open_source
from ropim.eval.segmentation import pixel_confusion, predict_logits, segmentation_scores
from ropim.train.segment.config import SegmentConfig
from ropim.train.speed import adamw_kernels, images_to
from ropim.train.task import EncoderTask, EpochData, Worker, bad_images, percents

log = logging.getLogger("ropim.segment")


def metric_name(name: str) -> str:
    """A class name as an MLflow metric key part."""
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", name) or "_"


@torch.no_grad()
def evaluate_confusion(model: torch.nn.Module, dataset, indices, cfg: SegmentConfig, num_classes: int,
                       device: torch.device, amp_dtype: torch.dtype | None = None,
                       progress: Callable[[int], object] | None = None, processes: int = 0) -> torch.Tensor:
    """The (K, K) pixel confusion matrix of ``model`` over the pairs ``indices`` of ``dataset`` (eval transform),
    decoded in ``processes`` DataLoader processes (0: this one); ``progress`` is handed 1 as each image is done."""
    was_training = model.training
    model.eval()
    conf = torch.zeros(num_classes, num_classes, dtype=torch.long)
    order = [indices[i] for i in dealt(len(indices), 1, processes)]  # each process reads its own part
    for image, mask in DataLoader(Subset(dataset, order), batch_size=None, num_workers=processes):
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = predict_logits(model, image.to(device), cfg.crop_size, num_classes, cfg.eval_mode,
                                    cfg.eval_stride, out_size=tuple(mask.shape))
        conf += pixel_confusion(logits.argmax(0).cpu(), mask, num_classes)
        if progress is not None:
            progress(1)
    model.train(was_training)
    return conf


class SegmentTask(EncoderTask):
    """Segmentation as the loop sees it."""

    CONFIG = SegmentConfig
    loss_name = "train_loss"

    def __init__(self, config: dict, worker: Worker) -> None:
        super().__init__(config, worker)
        cfg = self.cfg
        source = open_source(cfg.data)
        self.classes = source.classes
        self.train_set = build_seg_dataset(cfg.data, "train", seg_train_transform(
            cfg.crop_size, (cfg.scale_min, cfg.scale_max), cfg.hflip, cfg.photometric), source)
        self.val_set = build_seg_dataset(cfg.data, "val", seg_eval_transform(cfg.crop_size), source)
        self.seg_config: dict = {}

    def build(self, worker: Worker) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        cfg = self.cfg
        seg = segmenter_from_encoder(self.enc_cfg["arch"], self.enc_cfg["timm_kwargs"],
                                     None if cfg.random_init else self.state, len(self.classes), cfg.crop_size,
                                     drop_path=cfg.drop_path, channels=cfg.channels, aux_channels=cfg.aux_channels,
                                     dropout=cfg.dropout)
        if worker.rank == 0:
            log.info(f"[{cfg.kind}] {seg.summary()}")
        self.seg_config = seg.config
        model = seg.model
        if worker.world > 1 and worker.device.type == "cuda":  # mmseg's SyncBN: batch statistics over the GPUs
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model.to(worker.device)
        optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                        layer_decay=cfg.layer_decay, **adamw_kernels(cfg.adamw))
        return model, optimizer

    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        return self.sharded(self.train_set, micro_batch, {"bad_images": bad_images(self.train_set)})

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        x = images_to(batch[0], self.worker.device, self.cfg.channels_last, non_blocking=self.cfg.pin_memory)
        y = batch[1].to(self.worker.device, non_blocking=self.cfg.pin_memory)
        return seg_loss(model(x), y, self.cfg.aux_weight, IGNORE), x.shape[0]

    def evaluate(self, model: torch.nn.Module, epoch: int, final: bool) -> dict[str, float]:
        k, w = len(self.classes), self.worker
        share = contiguous_share(len(self.val_set), w.rank, w.world)
        conf = evaluate_confusion(model, self.val_set, share, self.cfg, k, w.device, self.amp_dtype,
                                  self.eval_pace(epoch, len(share)), self.cfg.dataloader_workers)
        conf = w.summed(conf.flatten().long()).reshape(k, k)  # every worker's pixels
        scores = segmentation_scores(conf)
        per_class = {f"iou.{metric_name(c)}": v for c, v in zip(self.classes, scores["per_class_iou"], strict=True)
                     if v == v}  # NaN: the class is in neither the labels nor the predictions
        self.extra = {"eval": {"epoch": epoch, "miou": scores["miou"], "pixel_acc": scores["pixel_acc"],
                               "per_class_iou": scores["per_class_iou"], "classes": self.classes,
                               "segmenter": self.seg_config}}
        return {"miou": scores["miou"], "pixel_acc": scores["pixel_acc"], **per_class}

    def epoch_end(self, model: torch.nn.Module, metrics: dict) -> None:
        val = ["val", *percents(metrics, "miou", "pixel_acc")] if "miou" in metrics else []  # an evaluated epoch
        self.log_epoch(metrics, f"train loss {metrics['train_loss']:.4f}", *val)
