"""Fine-tuning an encoder into a classifier with the paper's recipe (timm), as the training loop runs it.

``FinetuneTask`` supplies the loop with a timm classifier built from the encoder (layer-wise lr decay), the
recipe's augmentation, Mixup / CutMix and label smoothing, and the val evaluation (top-1 / top-5 and the
confusion matrix, sharded over the workers; the last one is kept for ``register.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from PIL import Image, ImageOps
from timm.data import Mixup, create_transform
from timm.data.auto_augment import RandAugment
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from torch.utils.data import DataLoader, Subset

from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.datasets import build_dataset, eval_transform
from ropim.data.sampling import contiguous_share, dealt
from ropim.eval.metrics import confusion_matrix, topk_hits
from ropim.train.downstream import classifier_from
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.speed import adamw_kernels, images_to
from ropim.train.task import EncoderTask, EpochData, Worker, bad_images, percents


def posterize(img: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize for current Pillow, which rejects 0 bits: keeping 0 bits gives a black image."""
    if bits_to_keep >= 8:
        return img
    return ImageOps.posterize(img, bits_to_keep) if bits_to_keep >= 1 else Image.new(img.mode, img.size)


def train_transform(cfg: FinetuneConfig, img_size: int):
    """The recipe's augmentation: RandomResizedCrop, flip, RandAugment, random erasing (per-pixel noise, as the
    official ``AUG.REMODE``), normalisation (timm).

    RandAugment "inc1" at magnitude 10 (reachable with mstd noise) asks Pillow ≥ 11 to keep 0 bits, which it
    rejects: this transform's own posterize ops use ``posterize`` above (timm's table is left as it is)."""
    transform = create_transform(img_size, is_training=True, scale=(cfg.crop_scale_min, 1.0), hflip=cfg.hflip,
                                 auto_augment=cfg.randaugment or None, re_prob=cfg.reprob, re_mode="pixel",
                                 interpolation="bicubic",
                                 mean=IMAGENET_MEAN, std=IMAGENET_STD)
    for t in transform.transforms:
        if isinstance(t, RandAugment):
            for op in t.ops:
                if op.name.startswith("Posterize"):
                    op.aug_fn = posterize
    return transform


@torch.no_grad()
def evaluate_counts(model: torch.nn.Module, loader: DataLoader, n_classes: int, device: torch.device,
                    amp_dtype: torch.dtype | None = None,
                    progress: Callable[[int], object] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """([top-1 hits, top-5 hits, n], confusion (K, K)) of ``model`` on ``loader``; ``progress`` is handed each
    batch's image count once it is done."""
    was_training = model.training
    model.eval()
    counts, conf = torch.zeros(3, dtype=torch.long), torch.zeros(n_classes, n_classes, dtype=torch.long)
    for x, y in loader:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(x.to(device)).float()
        h1, h5 = topk_hits(logits, y)
        counts += torch.tensor([h1, h5, len(y)])
        conf += confusion_matrix(logits.argmax(1), y, n_classes)
        if progress is not None:
            progress(len(y))
    model.train(was_training)
    return counts, conf


class FinetuneTask(EncoderTask):
    """Fine-tuning as the loop sees it."""

    CONFIG = FinetuneConfig
    loss_name = "train_loss"

    def __init__(self, config: dict, worker: Worker) -> None:
        super().__init__(config, worker)
        cfg = self.cfg
        self.img_size = cfg.img_size or self.enc_cfg["img_size"]
        self.train_set = build_dataset(cfg.data, "train", train_transform(cfg, self.img_size), self.img_size)
        self.classes = list(self.train_set.classes)
        mixing = cfg.mixup > 0 or cfg.cutmix > 0
        self.mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                           num_classes=len(self.classes)) if mixing else None
        self.criterion = SoftTargetCrossEntropy() if mixing else LabelSmoothingCrossEntropy(cfg.label_smoothing)

    def build(self, worker: Worker) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        cfg = self.cfg
        model = classifier_from(self.enc_cfg, None if cfg.random_init else self.state, len(self.classes), self.img_size,
                                cfg.drop_path, uri=cfg.encoder, quiet=worker.rank != 0).to(worker.device)
        optimizer = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                                        layer_decay=cfg.layer_decay, **adamw_kernels(cfg.adamw))
        return model, optimizer

    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        cfg = self.cfg
        val_set = build_dataset(cfg.data, "val", eval_transform(self.img_size), self.img_size)
        batch, share = max(micro_batch, 64), contiguous_share(len(val_set), worker.rank, worker.world)
        order = [share[i] for i in dealt(len(share), batch, cfg.dataloader_workers)]  # a process reads its own part
        self.val_loader = DataLoader(Subset(val_set, order), batch_size=batch, num_workers=cfg.dataloader_workers)
        return self.sharded(self.train_set, micro_batch, {"bad_images": bad_images(self.train_set)})

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        x = images_to(batch[0], self.worker.device, self.cfg.channels_last, non_blocking=self.cfg.pin_memory)
        y = batch[1].to(self.worker.device, non_blocking=self.cfg.pin_memory)
        if self.mixup is not None:
            x, y = self.mixup(x, y)
        return self.criterion(model(x), y), x.shape[0]

    def evaluate(self, model: torch.nn.Module, epoch: int, final: bool) -> dict[str, float]:
        n_classes = len(self.classes)
        counts, conf = evaluate_counts(model, self.val_loader, n_classes, self.worker.device, self.amp_dtype,
                                       self.eval_pace(epoch, len(self.val_loader.dataset)))
        gathered = self.worker.summed(torch.cat([counts, conf.flatten()]).long())  # every worker's images
        counts, conf = gathered[:3], gathered[3:].reshape(n_classes, n_classes)
        metrics = {"top1": 100 * counts[0].item() / counts[2].item(), "top5": 100 * counts[1].item() / counts[2].item()}
        self.extra = {"eval": {"epoch": epoch, **metrics, "classes": self.classes, "confusion": conf.tolist(),
                               "img_size": self.img_size}}
        return metrics

    def epoch_end(self, model: torch.nn.Module, metrics: dict) -> None:
        val = ["val", *percents(metrics, "top1", "top5")] if "top1" in metrics else []  # an evaluated epoch
        self.log_epoch(metrics, f"train loss {metrics['train_loss']:.4f}", *val)
