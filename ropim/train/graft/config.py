"""What an LGP-ROPIM graft is (``GraftConfig``): MoCo v3 training of a registered encoder with LGP's layer-wise
learning rates. Imports nothing heavy, so that the command line parses and validates fast. Defaults are MoCo v3's
ViT recipe (``ropim/presets/graft/`` holds the paper's and the digits one; README "LGP-ROPIM")."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ropim.checks import COUNT, POSITIVE, Range
from ropim.errors import ConfigError
from ropim.tracking.names import DEFAULT_ENCODER_NAME
from ropim.train.encoder_job import EncoderJob
from ropim.train.frozen_eval import FrozenEvalJob

LGP_LOWER_SHARE = 2 / 3  # LGP's ViT-B: blocks 1-8 of 12 at the lower rate ("1.5e-5,1.5e-5,1.5e-4" over 3 thirds)


@dataclass(frozen=True)
class GraftConfig(EncoderJob, FrozenEvalJob):
    """MoCo v3 on top of a registered encoder, the lower blocks at a fraction of the rate (LGP); ``ropim graft
    --help`` lists it."""

    NAME = "graft"
    RULES = {**EncoderJob.RULES, **FrozenEvalJob.RULES, "base_lr": POSITIVE, "global_batch_size": COUNT,
             "beta2": Range(0, 1, high_open=True), "lower_blocks": Range(0, integer=True, optional=True),
             "lower_lr_ratio": Range(0, 1, low_open=True), "temperature": POSITIVE,
             "momentum": Range(0, 1, high_open=True), "proj_dim": COUNT, "mlp_dim": COUNT,
             "crop_min": Range(0, 1, low_open=True), "drop_path": Range(0, 1, high_open=True)}
    warmup_prefix = True  # MoCo v3's schedule: after the warm-up, a half cosine over the remaining epochs

    global_batch_size: int = 128
    """images (pairs of views) per optimizer step over all workers"""
    base_lr: float = 1.5e-4
    """upper blocks' lr = base_lr × global_batch_size / 256 (MoCo v3's rule)"""
    min_lr: float = 0.0
    weight_decay: float = 0.1
    beta2: float = 0.999
    """AdamW β2 (torch's default, as MoCo v3 uses it)"""
    lower_blocks: int | None = None
    """blocks 0 … lower_blocks−1 (and the embedding) at the lower rate; None: 2/3"""
    lower_lr_ratio: float = 0.1
    """their lr as a share of the upper blocks' (LGP: 1.5e-5 / 1.5e-4)"""
    temperature: float = 0.2
    """MoCo v3's τ for ViT"""
    momentum: float = 0.99
    """m0 of the momentum encoder's EMA"""
    momentum_cosine: bool = True
    """m rises from m0 to 1 on a half cosine over the run (MoCo v3's --moco-m-cos)"""
    proj_dim: int = 256
    """output of projector and predictor"""
    mlp_dim: int = 4096
    """hidden width of projector and predictor"""
    freeze_patch_embed: bool = True
    """MoCo v3's stability fix (--stop-grad-conv1): the patch projection not trained"""
    crop_min: float = 0.08
    """RandomResizedCrop's smallest area share"""
    drop_path: float = 0.0
    """stochastic depth of the encoder while grafting (MoCo v3 uses none)"""
    experiment: str = "ropim-graft"
    registered_model: str = DEFAULT_ENCODER_NAME
    """the grafted encoder: a new version of this model ("": none)"""

    def check(self) -> None:
        micro = self.global_batch_size // (max(1, self.num_workers) * self.accum_steps)
        if micro < 2:
            raise ConfigError(f"global_batch_size={self.global_batch_size}: {micro} image per worker micro batch "
                              f"(num_workers={self.num_workers} × accum_steps={self.accum_steps}); MoCo v3 needs at "
                              "least 2 (batch norm in its MLPs, a negative for every query)")

    def split(self, depth: int) -> int:
        """Blocks trained at the lower rate in an encoder of ``depth`` blocks; ConfigError when outside it."""
        lower = int(LGP_LOWER_SHARE * depth) if self.lower_blocks is None else self.lower_blocks
        if not 0 <= lower <= depth:
            raise ConfigError(f"lower_blocks={lower}: the encoder {self.encoder} has {depth} block"
                              f"{'s' if depth != 1 else ''}; the split point must lie in [0, {depth}] (or null for "
                              f"LGP's 2/3: {int(LGP_LOWER_SHARE * depth)})")
        return lower

    def check_encoder(self, uri: str, config: dict) -> None:
        """The encoder takes RGB images at its own size and the split point lies within its blocks (``depth`` of its
        ``config.json``)."""
        super().check_encoder(uri, config)
        if "depth" in config:
            self.split(config["depth"])

    def pinned(self, uri: str, config: dict, pinned: str) -> GraftConfig:
        """The split point fixed too (LGP's 2/3 of the encoder's blocks when ``lower_blocks`` is null)."""
        return replace(super().pinned(uri, config, pinned), lower_blocks=self.split(config["depth"]))

    @property
    def lr(self) -> float:
        """Peak learning rate of the upper blocks after MoCo v3's linear scaling rule."""
        return self.base_lr * self.global_batch_size / 256
