"""Data sources and transforms. Pure torch/torchvision/scikit-learn: no Ray, no MLflow.

Built-in set ``digits``: scikit-learn's 1,797 real 8×8 handwritten digits (ships with the package,
no download), upscaled to 32×32 and repeated to 3 channels, split into train/val with a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from ropim.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SOURCES = ("digits",)
SPLITS = ("train", "val")


@dataclass(frozen=True)
class DataConfig:
    """Where images come from and how they are split."""

    source: str = "digits"
    val_fraction: float = 0.2  # used where the source has no split of its own
    split_seed: int = 0

    def validate(self) -> DataConfig:
        """Raise ConfigError naming the bad field and its fix."""
        if self.source not in SOURCES:
            raise ConfigError(f"data source={self.source!r}: unknown; choose one of {', '.join(SOURCES)}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction={self.val_fraction}: must be in (0, 1), e.g. 0.2")
        return self


class ImageArrayDataset(Dataset):
    """(PIL image, label) pairs from a uint8 (N, H, W, 3) array, passed through ``transform``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, classes: list[str], transform=None) -> None:
        self.images, self.labels, self.classes, self.transform = images, labels, classes, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = Image.fromarray(self.images[i])
        return (self.transform(img) if self.transform else img), int(self.labels[i])


def load_digits(size: int = 32) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """scikit-learn digits as uint8 (1797, size, size, 3) images, int64 labels, class names."""
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.from_numpy(bunch.images).float().unsqueeze(1) * (255.0 / 16.0)  # (N, 1, 8, 8) in [0, 255]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1)  # (N, 3, size, size)
    return x.permute(0, 2, 3, 1).contiguous().numpy(), bunch.target.astype(np.int64), [str(d) for d in range(10)]


def split_indices(n: int, val_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """A seeded random train/val partition of range(n)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(n * val_fraction))
    return {"val": np.sort(perm[:n_val]), "train": np.sort(perm[n_val:])}


def build_dataset(cfg: DataConfig, split: str, transform=None, img_size: int = 32) -> ImageArrayDataset:
    """The ``split`` ('train' or 'val') of the configured source."""
    cfg.validate()
    if split not in SPLITS:
        raise ConfigError(f"split={split!r}: choose one of {', '.join(SPLITS)}")
    images, labels, classes = load_digits(img_size)
    idx = split_indices(len(labels), cfg.val_fraction, cfg.split_seed)[split]
    return ImageArrayDataset(images[idx], labels[idx], classes, transform)


def pretrain_transform(img_size: int) -> v2.Compose:
    """The paper's pretraining augmentation: RandomResizedCrop(0.67–1, 3/4–4/3), flip, normalize."""
    return v2.Compose([
        v2.PILToTensor(),
        v2.RandomResizedCrop(img_size, scale=(0.67, 1.0), ratio=(3 / 4, 4 / 3), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def eval_transform(img_size: int) -> v2.Compose:
    """Resize and normalize, no randomness."""
    return v2.Compose([
        v2.PILToTensor(),
        v2.Resize((img_size, img_size), antialias=True),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
