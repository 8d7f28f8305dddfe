"""Where the data comes from: images with class labels (``DataConfig``) or images with label maps
(``SegDataConfig``), from the built-in set, a folder, Parquet shards or a URI. Imports nothing heavy, so that the
command line parses and validates fast; ``validate`` checks the source on disk cheaply (``ropim.data.sources``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from ropim.checks import COUNT, SEED, Range, check_fields, check_location
from ropim.errors import ConfigError
from ropim.paths import resolve_path


@dataclass(frozen=True)
class DataConfig:
    """Where images come from, how they are split, and what to do with undecodable ones."""

    source: str = "digits"
    """"digits", or a folder / file / glob / URI (ImageFolder, CIFAR, Parquet)"""
    format: Literal["auto", "digits", "imagefolder", "cifar", "parquet"] = "auto"
    """the source's format (auto: detect it)"""
    val_fraction: float = 0.2
    """used where the source has no split of its own"""
    split_seed: int = 0
    """seeds the val fraction's choice"""
    on_bad_image: Literal["skip", "fail"] = "skip"
    """undecodable images: skip (count, log) or fail"""
    max_pixels: int = 25_000_000
    """larger images are bad images (a decompression-bomb guard: 2× a 12 MP photo)"""
    follow_links: bool = False
    """ImageFolder and folder pairs: also follow symbolic links to folders and images outside the source (a subset
    linked into a larger set); links inside it are always followed, and each real file is listed once either way"""

    TASK: ClassVar[str] = "classify"  # what an item is: an image with a class (``ropim.data.formats``)
    FORMATS: ClassVar[tuple[str, ...]] = ("digits", "parquet", "cifar", "imagefolder")  # the formats of the task
    UNKNOWN: ClassVar[str] = "unknown"  # how an unknown format is worded
    HOLDS: ClassVar[str] = "the images"  # what a source holds, for the empty-source error
    RULES: ClassVar[dict] = {"split_seed": SEED, "max_pixels": COUNT}  # numeric fields, ``ropim.checks``

    def validate(self) -> DataConfig:
        """Raise ConfigError naming the bad field or path and its fix (checks the source on disk, cheaply)."""
        if self.format not in ("auto", *self.FORMATS):
            raise ConfigError(f"data format={self.format!r}: {self.UNKNOWN}; choose auto or one of "
                              f"{', '.join(self.FORMATS)}")
        if not (isinstance(self.val_fraction, (int, float)) and 0.0 < self.val_fraction < 1.0):
            raise ConfigError(f"val_fraction={self.val_fraction}: must be in (0, 1), e.g. 0.2")
        check_fields(self, self.RULES, "data.")
        if not self.source:
            raise ConfigError(f"data source is empty; give 'digits' or a path to {self.HOLDS}")
        check_location(self.source, "data.source")
        from ropim.data.sources import check_source  # pyarrow: only when a config is checked

        check_source(self)
        return self

    def resolved(self) -> DataConfig:
        """The same config with a local source made absolute against the working folder (``ropim.paths``)."""
        return replace(self, source=resolve_path(self.source, ("digits",)))


@dataclass(frozen=True)
class SegDataConfig(DataConfig):
    """A segmentation source: ``DataConfig``'s location and split rule, with label maps beside the images.

    Label maps hold class indices 0..K-1 and 255 for pixels to ignore, except ADE20K's (0 = ignore, 1..150 =
    classes), which are shifted down by one as mmseg's ``reduce_zero_label`` does."""

    source: str = "digits"
    """"digits", or a folder / file / glob / URI (ADE20K, an images/ + masks/ pair, Parquet)"""
    format: Literal["auto", "digits", "ade20k", "pairs", "parquet"] = "auto"
    """the source's format (auto: detect it)"""
    num_classes: int | None = None
    """pairs without classes.json need it; others know their classes"""
    canvas_size: int = 64
    """built-in digits: the side of each canvas"""
    canvases: int = 1200
    """built-in digits: how many canvases (split by val_fraction)"""
    check_pairs: int = 64
    """pairs decoded before a run starts (sizes, label range); every pair is checked on load"""

    TASK: ClassVar[str] = "segment"  # an image with a label map
    FORMATS: ClassVar[tuple[str, ...]] = ("digits", "parquet", "ade20k", "pairs")
    UNKNOWN: ClassVar[str] = "unknown for segmentation"
    HOLDS: ClassVar[str] = "the images and masks"
    RULES: ClassVar[dict] = {**DataConfig.RULES, "canvas_size": Range(16, 1024, integer=True),
                             "canvases": Range(10, integer=True), "check_pairs": Range(0, integer=True),
                             "num_classes": Range(1, 255, integer=True, optional=True)}
