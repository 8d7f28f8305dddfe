"""Where images and their label maps come from (``SegDataConfig``): the built-in digits canvases, the ADE20K release
layout, a folder pair of images and masks, or Parquet shards with an image and a mask column. Imports nothing heavy;
``validate`` checks the source on disk cheaply (``ropim.data.seg_sources.check_seg_source``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ropim.checks import COUNT, SEED, Range, check_fields, check_location
from ropim.data.config import DataConfig
from ropim.errors import ConfigError

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

    def validate(self) -> SegDataConfig:
        """Raise ConfigError naming the bad field or path and its fix (checks the source on disk, cheaply)."""
        if self.format not in ("auto", *SEG_FORMATS):
            raise ConfigError(f"data format={self.format!r}: unknown for segmentation; choose auto or one of "
                              f"{', '.join(SEG_FORMATS)}")
        if self.on_bad_image not in ("skip", "fail"):
            raise ConfigError(f"data on_bad_image={self.on_bad_image!r}: choose skip or fail")
        if not (isinstance(self.val_fraction, (int, float)) and 0.0 < self.val_fraction < 1.0):
            raise ConfigError(f"val_fraction={self.val_fraction}: must be in (0, 1), e.g. 0.2")
        check_fields(self, {"split_seed": SEED, "max_pixels": COUNT, "canvas_size": Range(16, 1024, integer=True),
                            "canvases": Range(10, integer=True), "check_pairs": Range(0, integer=True),
                            "num_classes": Range(1, 255, integer=True, optional=True)}, "data.")
        if not self.source:
            raise ConfigError("data source is empty; give 'digits' or a path to the images and masks")
        check_location(self.source, "data.source")
        from ropim.data.seg_sources import check_seg_source  # pyarrow: only when a config is checked

        check_seg_source(self)
        return self
