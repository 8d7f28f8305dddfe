"""Torch datasets of image + label-map pairs and their joint transforms (torchvision.transforms.v2, the label map a
``tv_tensors.Mask``: resized with nearest neighbours, padded with the ignore label). No Ray, no MLflow.

Training (mmseg's ADE20K pipeline, its crop and photometric distortion in ``ropim.data.seg_augment``): random scale
(the shorter side to 0.5–2.0 × the crop), random crop redrawn while one class covers 75% of it (``cat_max_ratio``),
horizontal flip, photometric distortion (brightness, contrast, saturation, hue, each with probability 0.5),
normalisation, padding at the bottom and right to the crop (image 0 after normalisation, label map ignore).
Evaluation: the shorter side resized to the crop size, normalised; the label map stays at its own size, where the
metrics are computed.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.config import SegDataConfig
from ropim.data.decode import BadImages
from ropim.data.formats.common import Source
from ropim.data.pair_lists import SegList
from ropim.data.seg_augment import CAT_MAX_RATIO, CatMaxRandomCrop, PadBottomRight, PhotoMetricDistortion
from ropim.data.sources import open_source
from ropim.errors import ConfigError, DataError


def seg_train_transform(crop: int, scale: tuple[float, float] = (0.5, 2.0), hflip: float = 0.5,
                        photometric: bool = True, cat_max_ratio: float = CAT_MAX_RATIO) -> v2.Compose:
    """(uint8 Image, Mask) → (float32 (3, crop, crop) normalized, int64 (crop, crop)), the training augmentation."""
    return v2.Compose([
        v2.RandomResize(max(1, round(crop * scale[0])), round(crop * scale[1]) + 1),  # shorter side, uniform
        CatMaxRandomCrop(crop, cat_max_ratio),
        v2.RandomHorizontalFlip(hflip),
        *([PhotoMetricDistortion()] if photometric else []),
        v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64}, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        PadBottomRight(crop),
    ])


def seg_eval_transform(crop: int) -> v2.Compose:
    """(uint8 Image, Mask) → (float32 (3, h, w) normalized with the shorter side = crop, the label map as it is)."""
    return v2.Compose([
        EvalResize(crop),
        v2.ToDtype({tv_tensors.Image: torch.float32, tv_tensors.Mask: torch.int64}, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


class EvalResize(torch.nn.Module):
    """The image's shorter side to ``size`` (bilinear, antialiased), its longer side at most ``LONG_SIDE`` × ``size``
    (mmseg's test ``Resize((2048, 512), keep_ratio=True)``: an image over 4:1 is scaled by its longer side); the label
    map untouched."""

    LONG_SIDE = 4

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, image: tv_tensors.Image, mask: tv_tensors.Mask) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        h, w = image.shape[-2:]
        if max(h, w) > self.LONG_SIDE * min(h, w):
            f = self.LONG_SIDE * self.size / max(h, w)
            return v2.functional.resize(image, [max(1, int(h * f + 0.5)), max(1, int(w * f + 0.5))],
                                        antialias=True), mask
        if min(h, w) == self.size:
            return image, mask
        return v2.functional.resize(image, self.size, antialias=True), mask


class SegDataset(Dataset):
    """(image, label map) pairs of a split under ``transform``. An undecodable file follows the bad-image policy
    (``skip``: logged, counted in ``bad``, the next pair in its place); a size or label mismatch stops the job."""

    def __init__(self, pairs: SegList, classes: list[str], transform, on_bad_image: str = "skip",
                 max_pixels: int = 25_000_000) -> None:
        self.pairs, self.classes, self.transform = pairs, classes, transform
        self.bad = BadImages(on_bad_image, max_pixels)

    def __len__(self) -> int:
        return len(self.pairs)

    def blocks(self) -> np.ndarray | None:
        """Where the blocks of pairs read together start (``Items.blocks``)."""
        return self.pairs.blocks()

    def raw(self, i: int) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        """Pair ``i`` (or the next decodable one) untransformed: uint8 (3, H, W) and (H, W)."""
        n = len(self.pairs)
        for j in (k % n for k in range(i, i + n)):
            if self.bad.seen(j):
                continue
            try:
                image, mask = self.pairs.load(j, self.bad.max_pixels)
            except ConfigError:
                raise
            except Exception as err:  # noqa: BLE001 — an unreadable or undecodable file makes the pair bad
                self.bad.add(self.pairs.paths[j], err, index=j)
                continue
            img = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy()).permute(2, 0, 1)  # (3, H, W)
            return tv_tensors.Image(img), tv_tensors.Mask(torch.from_numpy(mask.copy()))
        raise DataError(f"no decodable pair among the {n} of this split; check the files")

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, mask = self.transform(*self.raw(i))
        return image.as_subclass(torch.Tensor), mask.as_subclass(torch.Tensor)


def build_seg_dataset(cfg: SegDataConfig, split: str, transform, source: Source | None = None) -> SegDataset:
    """The ``split`` ('train' / 'val') of a segmentation source under ``transform``."""
    src = source or open_source(cfg)
    return SegDataset(src.split(split), src.classes, transform, cfg.on_bad_image, cfg.max_pixels)
