"""What ``ropim viz`` draws (``VizConfig``); imports nothing heavy, so the command line parses fast."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ropim.errors import ConfigError


@dataclass(frozen=True)
class VizConfig:
    """``ropim viz``: pictures from a checkpoint (full grid) or a registered encoder, and Figure 5."""

    encoder: str | None = None  # models:/… of a registered encoder: projection columns (+ predictions with a decoder)
    checkpoint: str | None = None  # Ray Train checkpoint folder (model.safetensors + config.json): the full grid
    out: str = "viz"  # output folder for the PNGs and token_errors.json
    n_images: int = 6  # rows of the reconstruction grid (first images of the split)
    split: str = "val"
    scale: int | None = None  # panel upscaling; None: about 128 px per panel
    seed: int = 0  # seeds the corruption drawn for the pictures
    fig5_images: int = 64  # images in the Figure-5 analysis
    fig5_rho: float = 0.25
    fig5_mask_ratio: float = 0.75
    fig5_threshold: float = 0.1

    def validate(self) -> VizConfig:
        if self.encoder and self.checkpoint:
            raise ConfigError("--encoder and --checkpoint: give one of them (or neither for Figure 5 only)")
        for name in ("n_images", "fig5_images"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if self.scale is not None and self.scale < 1:
            raise ConfigError(f"scale={self.scale}: must be ≥ 1 (or null for the default)")
        if not 0 < self.fig5_mask_ratio < 1:
            raise ConfigError(f"fig5_mask_ratio={self.fig5_mask_ratio}: must be in (0, 1)")
        if self.checkpoint and not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: no such folder")
        return self
