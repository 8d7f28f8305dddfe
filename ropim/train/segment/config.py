"""What a segmentation transfer job is (``SegmentConfig``): an encoder, a segmentation source, UperNet's sizes and
the BEiT/MAE ADE20K recipe (AdamW, weight decay 0.05, layer decay 0.65, linear warm-up then poly decay). Imports
nothing heavy, so that the command line parses and validates fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ropim.checks import COUNT, NON_NEGATIVE, POSITIVE, Range
from ropim.data.config import SegDataConfig
from ropim.errors import ConfigError
from ropim.tracking.names import DEFAULT_SEGMENTER_NAME
from ropim.train.encoder_job import TransferJob


@dataclass(frozen=True)
class SegmentConfig(TransferJob):
    """UperNet semantic segmentation from an encoder; ``ropim segment --help`` lists it."""

    NAME = "segment"
    RULES = {**TransferJob.RULES, "lr": POSITIVE, "crop_size": Range(8, 4096, integer=True), "channels": COUNT,
             "aux_channels": COUNT, "aux_weight": NON_NEGATIVE, "dropout": Range(0, 1, high_open=True),
             "scale_min": POSITIVE, "scale_max": POSITIVE, "eval_stride": Range(1, integer=True, optional=True),
             "viz_images": Range(0, integer=True)}
    schedule = "poly"  # the loop's decay after the warm-up (``JobConfig.schedule``)

    data: SegDataConfig = field(default_factory=SegDataConfig)
    crop_size: int = 512
    """training crops and inference windows; the encoder is rebuilt at this size"""
    epochs: int = 128
    """optimizer steps = epochs × steps per epoch (max_steps_per_epoch caps the latter)"""
    batch_size: int = 16
    """global: split over num_workers"""
    lr: float = 1e-4
    """peak learning rate (not scaled by the batch)"""
    min_lr: float = 0.0
    warmup_epochs: float = 1.2
    layer_decay: float = 0.65
    channels: int = 768
    """UperNet's decoder width (BEiT's and MAE's mmseg configs: the encoder width)"""
    aux_channels: int = 256
    """the auxiliary FCN head's width"""
    aux_weight: float = 0.4
    """the auxiliary loss weight"""
    dropout: float = 0.1
    """before each classifier"""
    scale_min: float = 0.5
    """random scale of the shorter side, × crop_size"""
    scale_max: float = 2.0
    """the largest random scale of the shorter side, × crop_size"""
    photometric: bool = True
    """brightness, contrast, saturation, hue jitter, each with probability 0.5"""
    eval_mode: Literal["slide", "whole"] = "slide"
    """sliding windows over the shorter-side-resized image, or one"""
    eval_stride: int | None = None
    """sliding-window stride (None: 2/3 of crop_size, mmseg's 341 at 512)"""
    viz_images: int = 4
    """val images in the logged picture (image | ground truth | prediction); 0 = none"""
    experiment: str = "ropim-segment"
    registered_model: str = DEFAULT_SEGMENTER_NAME
    """"" = do not register the segmenter"""

    def check(self) -> None:
        if self.scale_min > self.scale_max:
            raise ConfigError(f"scale_min={self.scale_min} > scale_max={self.scale_max}: give scale_min ≤ scale_max")
        if self.eval_mode == "slide" and self.eval_stride is not None and self.eval_stride > self.crop_size:
            raise ConfigError(f"eval_stride={self.eval_stride} > crop_size={self.crop_size}: the sliding windows would "
                              "skip the pixels between them; give eval_stride ≤ crop_size (None: 2/3 of it)")
        if self.batch_size // (max(1, self.num_workers) * self.accum_steps) < 2:
            raise ConfigError(f"batch_size={self.batch_size}: needs at least 2 images per worker and micro batch "
                              f"(batch norm in the decoder) over num_workers={self.num_workers} × accum_steps="
                              f"{self.accum_steps}")

    def check_encoder(self, uri: str, config: dict) -> None:
        """The encoder (its ``config.json``) takes RGB images and its patch size divides the crop: one error naming
        both otherwise."""
        super().check_encoder(uri, config)
        p = config["patch_size"]
        if self.crop_size % p:
            fix = max(p, self.crop_size - self.crop_size % p)
            raise ConfigError(f"crop_size={self.crop_size}: encoder {uri} has patch size {p}, which must divide the "
                              f"crop size (e.g. crop_size={fix})")

    def size(self, config: dict) -> str:
        return f" at {self.crop_size}px crops"

    @property
    def kind(self) -> str:
        """``segment``, or ``segment-random-init`` for the from-scratch baseline."""
        return "segment-random-init" if self.random_init else "segment"
