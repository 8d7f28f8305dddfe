"""Where images and their label maps come from (``SegDataConfig``): the built-in digits canvases, the ADE20K release
layout, a folder pair of images and masks, or Parquet shards with an image and a mask column. Imports nothing heavy;
``validate`` checks the source on disk cheaply (``ropim.data.seg_sources.check_seg_source``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ropim.checks import Range
from ropim.data.config import DataConfig

SEG_FORMATS = ("digits", "ade20k", "pairs", "parquet")


@dataclass(frozen=True)
class SegDataConfig(DataConfig):
    """A segmentation source: ``DataConfig``'s location and split rule, with label maps beside the images.

    Label maps hold class indices 0..K-1 and 255 for pixels to ignore, except ADE20K's (0 = ignore, 1..150 =
    classes), which are shifted down by one as mmseg's ``reduce_zero_label`` does."""

    format: Literal["auto", "digits", "ade20k", "pairs", "parquet"] = "auto"
    num_classes: int | None = None  # pairs without classes.json need it; others know their classes
    canvas_size: int = 64  # built-in digits: the side of each canvas
    canvases: int = 1200  # built-in digits: how many canvases (split by val_fraction)
    check_pairs: int = 64  # pairs decoded before a run starts (sizes, label range); every pair is checked on load

    FORMATS: ClassVar[tuple[str, ...]] = SEG_FORMATS
    UNKNOWN: ClassVar[str] = "unknown for segmentation"
    HOLDS: ClassVar[str] = "the images and masks"
    RULES: ClassVar[dict] = {**DataConfig.RULES, "canvas_size": Range(16, 1024, integer=True),
                             "canvases": Range(10, integer=True), "check_pairs": Range(0, integer=True),
                             "num_classes": Range(1, 255, integer=True, optional=True)}

    def check_source(self) -> None:
        """The images and masks hold what they should (``ropim.data.seg_sources.check_seg_source``)."""
        from ropim.data.seg_sources import check_seg_source  # pyarrow: only when a config is checked

        check_seg_source(self)
