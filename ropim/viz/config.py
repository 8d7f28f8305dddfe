"""What ``ropim viz`` draws (``VizConfig``); imports nothing heavy, so the command line parses fast."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ropim.checks import COUNT, NON_NEGATIVE, SEED, Range, check_fields, check_folder
from ropim.errors import ConfigError
from ropim.paths import resolve_path


@dataclass(frozen=True)
class VizConfig:
    """``ropim viz``: pictures from a checkpoint (full grid) or a registered encoder, and Figure 5."""

    encoder: str | None = None
    """models:/… of a registered encoder: projection columns (+ predictions with a decoder)"""
    checkpoint: str | None = None
    """Ray Train checkpoint folder (model.safetensors + config.json): the full grid"""
    out: str = "viz"
    """output folder for the PNGs and token_errors.json"""
    n_images: int = 6
    """rows of the reconstruction grid (first images of the split)"""
    split: str = "val"
    """the split the images come from"""
    scale: int | None = None
    """panel upscaling; None: about 128 px per panel"""
    seed: int = 0
    """seeds the corruption drawn for the pictures"""
    fig5_images: int = 64
    """images in the Figure-5 analysis"""
    fig5_rho: float = 0.25
    """Figure 5: the sketch ratio"""
    fig5_mask_ratio: float = 0.75
    """Figure 5: the masking ratio ROPIM is compared with"""
    fig5_threshold: float = 0.1
    """Figure 5: a token counts as changed when its error exceeds this"""

    def validate(self) -> VizConfig:
        """Raise ConfigError naming the bad field and its fix."""
        if self.encoder and self.checkpoint:
            raise ConfigError("--encoder and --checkpoint: give one of them (or neither for Figure 5 only)")
        check_folder(self.out, "--out")  # the pictures are written after the model is loaded
        open_share = Range(0, 1, low_open=True, high_open=True)
        check_fields(self, {"n_images": COUNT, "fig5_images": COUNT, "scale": Range(1, integer=True, optional=True),
                            "seed": SEED, "fig5_rho": open_share, "fig5_mask_ratio": open_share,
                            "fig5_threshold": NON_NEGATIVE})
        if self.checkpoint and not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: no such folder")
        return self

    def resolved(self) -> VizConfig:
        """The same config with its local paths (encoder folder, checkpoint, out) absolute (``ropim.paths``)."""
        return replace(self, encoder=resolve_path(self.encoder), checkpoint=resolve_path(self.checkpoint),
                       out=resolve_path(self.out))
