"""The ADE20K release, for segmentation: ``ROOT/images/{training,validation}/*.jpg`` +
``ROOT/annotations/{training,validation}/*.png``, its own split; label 0 = ignore, 1..150 = classes, shifted to
0..149 (0 → 255) as mmseg's ``reduce_zero_label`` does. No torch, no Ray, no MLflow."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ropim.data.formats.common import SEGMENT, Source
from ropim.data.formats.pairs import folder_pairs
from ropim.errors import ConfigError
from ropim.paths import resolve_path

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import SegDataConfig

NAME = "ade20k"
TASKS = (SEGMENT,)
CLASSES = 150


def detect(path: str) -> bool:
    """``images/training/`` and ``annotations/training/`` under the folder."""
    return all(os.path.isdir(os.path.join(path, d, "training")) for d in ("images", "annotations"))


def check(cfg: SegDataConfig) -> None:
    """The release layout is there (a forced ``format=ade20k`` names what it lacks)."""
    if not detect(resolve_path(cfg.source)):
        raise ConfigError(f"data source {cfg.source!r}: not the ADE20K layout (expected images/training/ + "
                          "annotations/training/, and validation/ beside each)")


def source(cfg: SegDataConfig, img_size: int = 32) -> Source:
    """The release's pairs (``img_size``: unused, transforms resize)."""
    root = resolve_path(cfg.source)
    return folder_pairs(cfg, NAME, os.path.join(root, "images"), os.path.join(root, "annotations"), CLASSES)
