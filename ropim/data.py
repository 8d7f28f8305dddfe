"""Data config, torch datasets over every source, and the transforms. No Ray, no MLflow.

``DataConfig.source`` is ``"digits"`` (built-in: scikit-learn's 1,797 real 8×8 handwritten digits, upscaled
to 32×32 RGB, split with a seed) or a path / glob / URI: an ImageFolder tree, a CIFAR-10/100 python folder, or
Parquet shards (see ``ropim.sources`` for the layouts and the split rule). ``DataConfig.validate()`` checks the
fields and that the source exists and holds images, raising one ConfigError before any expensive work.

``build_dataset`` gives a map-style torch Dataset (for fine-tuning, kNN, small pretraining runs); cluster-scale
pretraining streams through Ray Data instead (``ropim.ingest``). The torch Dataset finds a bad image when it
decodes it: under ``on_bad_image="skip"`` it logs and counts it (``dataset.bad``) and returns the next decodable
image of the split in its place, so ``len()`` stays fixed; ``ropim data convert`` drops bad images for good.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ropim.augment import IMAGENET_MEAN, IMAGENET_STD, augment, normalize, resize
from ropim.errors import ConfigError
from ropim.sources import (  # noqa: F401 — re-exported: the data layer's public API
    FORMATS,
    BadImageError,
    BadImages,
    ImageList,
    check_source,
    decode_rgb,
    is_uri,
    load_digits,
    open_source,
    split_indices,
    split_list,
)

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "BadImageError", "DataConfig", "ImageArrayDataset", "ImageListDataset",
           "build_dataset", "check_source", "count_images", "eval_transform", "load_digits", "pretrain_transform",
           "split_indices"]
SOURCES = ("digits", "<path>")
SPLITS = ("train", "val")


@dataclass(frozen=True)
class DataConfig:
    """Where images come from, how they are split, and what to do with undecodable ones."""

    source: str = "digits"  # "digits", or a folder / file / glob / URI (ImageFolder, CIFAR, Parquet)
    format: Literal["auto", "digits", "imagefolder", "cifar", "parquet"] = "auto"
    val_fraction: float = 0.2  # used where the source has no split of its own
    split_seed: int = 0
    on_bad_image: Literal["skip", "fail"] = "skip"

    def validate(self) -> DataConfig:
        """Raise ConfigError naming the bad field or path and its fix (checks the source on disk, cheaply)."""
        if self.format not in ("auto", *FORMATS):
            raise ConfigError(f"data format={self.format!r}: unknown; choose auto or one of {', '.join(FORMATS)}")
        if self.on_bad_image not in ("skip", "fail"):
            raise ConfigError(f"data on_bad_image={self.on_bad_image!r}: choose skip or fail")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction}: must be in (0, 1), e.g. 0.2")
        if not self.source:
            raise ConfigError("data source is empty; give 'digits' or a path to the images")
        check_source(self)
        return self

    def resolved(self) -> DataConfig:
        """The same config with a local relative path made absolute (for Ray workers in another cwd)."""
        if self.source == "digits" or is_uri(self.source):
            return self
        return replace(self, source=os.path.abspath(os.path.expanduser(self.source)))


class ImageArrayDataset(Dataset):
    """(PIL image, label) pairs from a uint8 (N, H, W, 3) array, passed through ``transform``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, classes: list[str], transform=None) -> None:
        self.images, self.labels, self.classes, self.transform = images, labels, classes, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), int(self.labels[i])


class ImageListDataset(Dataset):
    """(transformed image, label) pairs from any source's ``ImageList``, under the bad-image policy.

    ``bad`` (a ``BadImages``) holds the count and first 20 paths of images skipped in this process.
    """

    def __init__(self, images: ImageList, transform=None, on_bad_image: str = "skip") -> None:
        self.images, self.transform = images, transform
        self.labels, self.classes, self.paths = images.labels, images.classes, images.paths
        self.bad = BadImages(on_bad_image)
        self._bad_idx: set[int] = set()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        n = len(self.images)
        for j in (k % n for k in range(i, i + n)):
            if j in self._bad_idx:
                continue
            try:
                img = decode_rgb(self.images.load(j))
            except Exception as err:  # noqa: BLE001 — any read/decode failure makes the image bad
                self._bad_idx.add(j)
                self.bad.add(self.paths[j], err)
                continue
            return (self.transform(img) if self.transform else img), int(self.labels[j])
        raise ConfigError(f"no decodable image among the {n} images of this split; check the files")


def count_images(cfg: DataConfig, split: str) -> int:
    """Images in ``split`` without decoding any (bad files included; they are found when decoded)."""
    return len(split_list(open_source(cfg), cfg, split))


def build_dataset(cfg: DataConfig, split: str, transform=None, img_size: int = 32) -> Dataset:
    """The ``split`` ('train' or 'val') of the configured source as a torch Dataset.

    ``img_size`` only sizes the built-in digits; other sources are resized by ``transform``. Every returned
    dataset has ``labels`` (int64 array) and ``classes``.
    """
    cfg.validate()
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: choose one of {', '.join(SPLITS)}")
    src = open_source(cfg, img_size)
    images = split_list(src, cfg, split)
    if src.format == "digits":
        return ImageArrayDataset(images.images, images.labels, images.classes, transform)
    return ImageListDataset(images, transform, cfg.on_bad_image)


def _torch_uniform() -> float:
    return torch.rand(()).item()


class PretrainTransform:
    """PIL image → float32 (3, size, size): the paper's RandomResizedCrop(0.67–1, 3/4–4/3) + flip + normalize.

    The same functions as Ray Data's decode step (``ropim.augment``); randomness from torch's RNG, so
    ``torch.manual_seed`` and DataLoader worker seeding apply.
    """

    def __init__(self, img_size: int) -> None:
        self.img_size = img_size

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return torch.from_numpy(normalize(augment(img.convert("RGB"), self.img_size, _torch_uniform)))


class EvalTransform:
    """PIL image → float32 (3, size, size): resize (antialiased bilinear) and normalize, no randomness."""

    def __init__(self, img_size: int) -> None:
        self.img_size = img_size

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return torch.from_numpy(normalize(resize(img.convert("RGB"), self.img_size)))


def pretrain_transform(img_size: int) -> PretrainTransform:
    """The paper's pretraining augmentation: RandomResizedCrop(0.67–1, 3/4–4/3), flip, normalize."""
    return PretrainTransform(img_size)


def eval_transform(img_size: int) -> EvalTransform:
    """Resize and normalize, no randomness."""
    return EvalTransform(img_size)
