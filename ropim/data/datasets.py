"""Torch datasets over every source and the pretraining / eval transforms. No Ray, no MLflow.

``build_dataset`` gives a map-style torch Dataset (for fine-tuning, kNN, small pretraining runs); cluster-scale
pretraining streams through Ray Data instead (``ropim.data.ingest``). The torch Dataset finds a bad image when it
decodes it: under ``on_bad_image="skip"`` it logs and counts it (``dataset.bad``) and returns the next decodable
image of the split in its place, so ``len()`` stays fixed; ``ropim data convert`` drops bad images for good.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ropim.checks import OneOf, check_value
from ropim.data.augment import augment, normalize, resize
from ropim.data.config import DataConfig
from ropim.data.decode import DEFAULT_MAX_PIXELS, BadImages, decode_rgb
from ropim.data.formats.common import Source
from ropim.data.lists import ImageList
from ropim.data.sources import open_source
from ropim.errors import ConfigError, DataError

SPLITS = ("train", "val")


def digest(classes: list[str], labels: np.ndarray, images: bytes) -> bytes:
    """A split's fingerprint: its classes, its labels and what its images are (``images``: their own fingerprint)."""
    h = hashlib.sha256(json.dumps(list(classes)).encode())
    h.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    h.update(images)
    return h.digest()


class ImageArrayDataset(Dataset):
    """(PIL image, label) pairs from a uint8 (N, H, W, 3) array, passed through ``transform``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, classes: list[str], transform=None) -> None:
        self.images, self.labels, self.classes, self.transform = images, labels, classes, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), int(self.labels[i])

    def fingerprint(self) -> bytes:
        """What the split holds (``digest``), without decoding: changed data gives another."""
        return digest(self.classes, self.labels, np.ascontiguousarray(self.images).tobytes())


class ImageListDataset(Dataset):
    """(transformed image, label) pairs from any source's ``ImageList``, under the bad-image policy.

    ``bad`` (a ``BadImages``) holds the count of images skipped (with a DataLoader's processes: ``BadImages.share``)
    and the first 20 paths this process skipped.
    """

    def __init__(self, images: ImageList, transform=None, on_bad_image: str = "skip",
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.images, self.transform = images, transform
        self.labels, self.classes, self.paths = images.labels, images.classes, images.paths
        self.bad = BadImages(on_bad_image, max_pixels)

    def __len__(self) -> int:
        return len(self.images)

    def blocks(self) -> np.ndarray | None:
        """Where the blocks of images read together start (``ImageList.blocks``)."""
        return self.images.blocks()

    def fingerprint(self) -> bytes:
        """What the split holds (``digest``), without decoding: changed data gives another."""
        return digest(self.classes, self.labels, self.images.fingerprint())

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        n = len(self.images)
        for j in (k % n for k in range(i, i + n)):
            if self.bad.seen(j):
                continue
            try:
                img = decode_rgb(self.images.load(j), self.bad.max_pixels)
            except ConfigError:  # a shard that cannot be read is the data set's fault, not one image's
                raise
            except Exception as err:  # noqa: BLE001 — any read/decode failure makes the image bad
                self.bad.add(self.paths[j], err, index=j)
                continue
            return (self.transform(img) if self.transform else img), int(self.labels[j])
        raise DataError(f"no decodable image among the {n} images of this split; check the files")


def build_dataset(cfg: DataConfig, split: str, transform=None, img_size: int = 32,
                  source: Source | None = None) -> Dataset:
    """The ``split`` ('train' or 'val') of the configured source as a torch Dataset.

    ``img_size`` only sizes the built-in digits; other sources are resized by ``transform``. ``source``: the
    source already opened (``open_source(cfg, img_size)``), so that both splits come from one listing. Every returned
    dataset has ``labels`` (int64 array) and ``classes``.
    """
    cfg.validate()
    check_value("split", split, OneOf(SPLITS))
    src = source or open_source(cfg, img_size)
    images = src.split(split)
    if src.format == "digits":
        return ImageArrayDataset(images.images, images.labels, images.classes, transform)
    return ImageListDataset(images, transform, cfg.on_bad_image, cfg.max_pixels)


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
    """PIL image → float32 (3, size, size): ``ropim.data.augment.resize`` (over 32 pixels the official evaluation's
    resize to 256/224 of the size and centre crop) and normalize, no randomness."""

    def __init__(self, img_size: int) -> None:
        self.img_size = img_size

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return torch.from_numpy(normalize(resize(img.convert("RGB"), self.img_size)))


def pretrain_transform(img_size: int) -> PretrainTransform:
    """The paper's pretraining augmentation: RandomResizedCrop(0.67–1, 3/4–4/3), flip, normalize."""
    return PretrainTransform(img_size)


def eval_transform(img_size: int) -> EvalTransform:
    """Resize (and centre-crop over 32 pixels) and normalize, no randomness."""
    return EvalTransform(img_size)


def eval_splits(data: DataConfig, img_size: int) -> tuple[Dataset, Dataset]:
    """(train, val) of ``data`` under the eval transform, from one listing of the source."""
    src = open_source(data, img_size)
    return tuple(build_dataset(data, split, eval_transform(img_size), img_size, source=src)
                 for split in ("train", "val"))


def validation_images(data: DataConfig, img_size: int, n: int = 6, split: str = "val") -> torch.Tensor:
    """The first ``n`` images of ``split`` (deterministic, eval transform): normalized (n, C, H, W)."""
    ds = build_dataset(data, split, eval_transform(img_size), img_size)
    if n < 1 or n > len(ds):
        raise ConfigError(f"n_images={n}: must be between 1 and {len(ds)} (the {split} split of {data.source})")
    return torch.stack([ds[i][0] for i in range(n)])
