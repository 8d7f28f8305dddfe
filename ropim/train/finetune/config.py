"""What a fine-tuning job is (``FinetuneConfig``): the paper's recipe from an encoder, its own fields and rules beside
what every job shares (``ropim.train.job``). Imports nothing heavy, so that the command line parses and validates
fast."""

from __future__ import annotations

from dataclasses import dataclass

from ropim.checks import NON_NEGATIVE, POSITIVE, SHARE, Range, check_encoder_input
from ropim.errors import ConfigError
from ropim.tracking.names import DEFAULT_CLASSIFIER_NAME
from ropim.train.encoder_job import TransferJob


@dataclass(frozen=True)
class FinetuneConfig(TransferJob):
    """A fine-tune of a registered encoder (the paper's recipe by default); ``ropim finetune --help`` lists it."""

    NAME = "finetune"
    RULES = {**TransferJob.RULES, "base_lr": POSITIVE, "label_smoothing": Range(0, 1, high_open=True),
             "mixup": NON_NEGATIVE, "cutmix": NON_NEGATIVE, "reprob": SHARE,
             "crop_scale_min": Range(0, 1, low_open=True), "img_size": Range(1, integer=True, optional=True)}

    img_size: int | None = None
    """None: the encoder's; another size resamples the position embedding"""
    base_lr: float = 5e-3
    """lr = base_lr × batch_size / 512 (the paper's grid: 5e-3, 1e-2, 2e-2)"""
    warmup_epochs: float = 5.0
    label_smoothing: float = 0.1
    """cross-entropy label smoothing"""
    mixup: float = 0.8
    """Mixup α (0: off)"""
    cutmix: float = 1.0
    """CutMix α (0: off)"""
    randaugment: str = "rand-m9-mstd0.5-inc1"
    """timm's RandAugment 9 / 0.5; "" disables"""
    reprob: float = 0.25
    """random erasing probability"""
    crop_scale_min: float = 0.08
    """RandomResizedCrop's smallest area share"""
    experiment: str = "ropim-finetune"
    registered_model: str = DEFAULT_CLASSIFIER_NAME
    """"" = do not register the classifier"""

    def check(self) -> None:
        """Mixup/CutMix pair the images of a micro batch: it is even on every worker count a run may have (from
        ``min_workers``, after an elastic restart, to ``num_workers``)."""
        if not (self.mixup > 0 or self.cutmix > 0):
            return
        workers = max(1, self.num_workers)
        for count in range(min(self.min_workers or workers, workers), workers + 1):
            micro = self.batch_size // (count * self.accum_steps)
            if micro % 2:
                where = "" if count == workers else ", a count an elastic restart (min_workers) may fall back to"
                raise ConfigError(f"batch_size={self.batch_size}: Mixup/CutMix needs an even micro batch per worker "
                                  f"(here {micro} on {count} workers{where}); change batch_size or set mixup=0 "
                                  "cutmix=0")

    def check_encoder(self, uri: str, config: dict) -> None:
        check_encoder_input(uri, config, self.img_size)

    def size(self, config: dict) -> str:
        return f" at {self.img_size or config['img_size']}px"

    @property
    def lr(self) -> float:
        """Peak learning rate after the linear scaling rule."""
        return self.base_lr * self.batch_size / 512

    @property
    def kind(self) -> str:
        """``finetune``, or ``random-init`` for the from-scratch baseline."""
        return "random-init" if self.random_init else "finetune"
