"""Where images come from (``DataConfig``): a built-in set, a folder, Parquet shards or a URI. Imports nothing
heavy, so that the command line parses and validates fast; the source on disk is checked by ``validate``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from ropim.checks import COUNT, SEED, check_fields, check_location
from ropim.errors import ConfigError
from ropim.paths import resolve_path

FORMATS = ("digits", "parquet", "cifar", "imagefolder")


@dataclass(frozen=True)
class DataConfig:
    """Where images come from, how they are split, and what to do with undecodable ones."""

    source: str = "digits"  # "digits", or a folder / file / glob / URI (ImageFolder, CIFAR, Parquet)
    format: Literal["auto", "digits", "imagefolder", "cifar", "parquet"] = "auto"
    val_fraction: float = 0.2  # used where the source has no split of its own
    split_seed: int = 0
    on_bad_image: Literal["skip", "fail"] = "skip"
    max_pixels: int = 25_000_000  # larger images are bad images (a decompression-bomb guard: 2× a 12 MP photo)

    FORMATS: ClassVar[tuple[str, ...]] = FORMATS
    UNKNOWN: ClassVar[str] = "unknown"  # how an unknown format is worded
    HOLDS: ClassVar[str] = "the images"  # what a source holds, for the empty-source error
    RULES: ClassVar[dict] = {"split_seed": SEED, "max_pixels": COUNT}  # numeric fields, ``ropim.checks``

    def validate(self) -> DataConfig:
        """Raise ConfigError naming the bad field or path and its fix (checks the source on disk, cheaply)."""
        if self.format not in ("auto", *self.FORMATS):
            raise ConfigError(f"data format={self.format!r}: {self.UNKNOWN}; choose auto or one of "
                              f"{', '.join(self.FORMATS)}")
        if self.on_bad_image not in ("skip", "fail"):
            raise ConfigError(f"data on_bad_image={self.on_bad_image!r}: choose skip or fail")
        if not (isinstance(self.val_fraction, (int, float)) and 0.0 < self.val_fraction < 1.0):
            raise ConfigError(f"val_fraction={self.val_fraction}: must be in (0, 1), e.g. 0.2")
        check_fields(self, self.RULES, "data.")
        if not self.source:
            raise ConfigError(f"data source is empty; give 'digits' or a path to {self.HOLDS}")
        check_location(self.source, "data.source")
        self.check_source()
        return self

    def check_source(self) -> None:
        """The source on disk holds what it should (cheap: ``ropim.data.layout.check_source``)."""
        from ropim.data.layout import check_source  # pyarrow: only when a config is checked

        check_source(self.source, self.format)

    def resolved(self) -> DataConfig:
        """The same config with a local source made absolute against the working folder (``ropim.paths``)."""
        return replace(self, source=resolve_path(self.source, ("digits",)))
