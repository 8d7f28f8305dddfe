"""mmseg's random crop (``cat_max_ratio``) and photometric distortion, as its ADE20K pipeline runs them, in numpy on
uint8 RGB images; the random draws come from torch's generator (seeded per DataLoader worker). No OpenCV.

Photometric distortion (mmseg ``PhotoMetricDistortion``), each step with probability 0.5: brightness, an additive
delta in [-32, 32] on 0–255; then contrast (a factor in [0.5, 1.5]) either here or last, chosen at random; saturation,
a factor in [0.5, 1.5] on the S channel; hue, an integer delta in [-18, 17] on OpenCV's 0–179 H scale (±36°; numpy's
``randint(-18, 18)`` excludes 18). Every step computes in float32, clips to 0–255 and truncates to uint8; saturation
and hue each go to HSV and back with OpenCV's 8-bit conversions (``COLOR_RGB2HSV`` / ``COLOR_HSV2RGB``).

Those conversions are reproduced bit for bit: RGB → HSV is OpenCV's fixed-point arithmetic; HSV → RGB is its
vectorised float path (fused multiply-adds, results truncated), checked against OpenCV 4.5.5, 4.14 and 5.0 on all
180 × 256 × 256 inputs (``scripts/opencv_hsv.py``). That path is what OpenCV runs on CPUs with AVX2 or AVX-512 for
every pixel of a row whose width is a multiple of 32 (64 with AVX-512), e.g. 512-wide crops; the last pixels of
other rows take OpenCV's scalar path, which rounds instead of truncating (one level brighter on 74% of inputs).

Random crop (mmseg ``RandomCrop``): a crop of at most ``crop`` × ``crop`` at a uniform offset; with ``cat_max_ratio``
< 1 the box is drawn again, up to 10 times, until the crop holds two or more classes (the ignore label left out)
and no class covers ``cat_max_ratio`` or more of its labelled pixels; after 10 failures the 11th box is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torchvision import tv_tensors

from ropim.data.pair_lists import IGNORE

BRIGHTNESS_DELTA = 32
CONTRAST_RANGE = (0.5, 1.5)
SATURATION_RANGE = (0.5, 1.5)
HUE_DELTA = 18
CAT_MAX_RATIO = 0.75
CROP_RETRIES = 10

_SHIFT = 12  # OpenCV's fixed-point fraction bits for RGB -> HSV
_SDIV = np.array([0] + [round((255 << _SHIFT) / i) for i in range(1, 256)], np.int32)
_HDIV = np.array([0] + [round((180 << _SHIFT) / (6 * i)) for i in range(1, 256)], np.int32)
# which of (v, v(1-s), v(1-sf), v(1-s(1-f))) is r, g, b in each 60° sector of the hue
_SECTOR_RGB = np.array([[0, 3, 1], [2, 0, 1], [1, 0, 3], [1, 2, 0], [3, 1, 0], [0, 1, 2]])
_F32 = np.float32


def rgb_to_hsv(rgb: np.ndarray) -> np.ndarray:
    """uint8 (..., 3) RGB → uint8 HSV as OpenCV's ``COLOR_RGB2HSV``: H in 0..179 (degrees / 2), S and V in 0..255."""
    r, g, b = (rgb[..., i].astype(np.int32) for i in range(3))
    v = rgb.max(-1).astype(np.int32)
    diff = v - rgb.min(-1)
    half = 1 << (_SHIFT - 1)
    s = (diff * _SDIV[v] + half) >> _SHIFT
    h = np.where(v == r, g - b, np.where(v == g, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * _HDIV[diff] + half) >> _SHIFT
    h = np.where(h < 0, h + 180, h)
    return np.stack([h, s, v], -1).astype(np.uint8)


def _fma(a: np.ndarray, b: np.ndarray, c: float) -> np.ndarray:
    """a·b + c rounded once to float32, as a fused multiply-add (exact in float64 for these float32 inputs)."""
    return (a.astype(np.float64) * b + c).astype(_F32)


def hsv_to_rgb(hsv: np.ndarray) -> np.ndarray:
    """uint8 (..., 3) HSV (H in 0..179) → uint8 RGB as OpenCV's vectorised ``COLOR_HSV2RGB`` (see the module doc)."""
    h = hsv[..., 0].astype(_F32) * (_F32(6) / _F32(180))
    s = hsv[..., 1].astype(_F32) * _F32(1 / 255)
    v = hsv[..., 2].astype(_F32) * _F32(1 / 255)
    sector = np.trunc(h)
    f = h - sector
    one = _F32(1)
    tab = np.stack([v, v * (one - s), v * _fma(-s, f, 1.0), v * _fma(-s, one - f, 1.0)], -1)
    rgb = np.take_along_axis(tab, _SECTOR_RGB[sector.astype(np.int64) % 6], -1) * _F32(255)
    return np.clip(np.trunc(rgb), 0, 255).astype(np.uint8)


def affine(img: np.ndarray, alpha: float = 1.0, beta: float = 0.0) -> np.ndarray:
    """``img · alpha + beta`` in float32, clipped to 0–255 and truncated to uint8 (mmseg's ``convert``)."""
    return np.clip(img.astype(_F32) * _F32(alpha) + _F32(beta), 0, 255).astype(np.uint8)


def _uniform(lo: float, hi: float) -> float:
    return lo + (hi - lo) * torch.rand((), dtype=torch.float64).item()


def _coin() -> bool:
    return bool(torch.randint(2, ()).item())


@dataclass(frozen=True)
class Photometric:
    """One draw of the distortion: each step's parameter, or None where the step is skipped."""

    brightness: float | None = None  # added on 0–255
    contrast: float | None = None  # factor
    saturation: float | None = None  # factor on S
    hue: int | None = None  # added to H (0–179, mod 180)
    contrast_first: bool = True  # contrast right after brightness, else after hue

    @classmethod
    def sample(cls) -> Photometric:
        """A draw from torch's generator: each step with probability 0.5, contrast's place with 0.5."""
        brightness = _uniform(-BRIGHTNESS_DELTA, BRIGHTNESS_DELTA) if _coin() else None
        contrast_first = _coin()
        contrast = _uniform(*CONTRAST_RANGE) if _coin() else None
        saturation = _uniform(*SATURATION_RANGE) if _coin() else None
        hue = int(torch.randint(-HUE_DELTA, HUE_DELTA, ()).item()) if _coin() else None
        return cls(brightness, contrast, saturation, hue, contrast_first)

    def apply(self, rgb: np.ndarray) -> np.ndarray:
        """The distorted copy of a uint8 (H, W, 3) RGB image."""
        img = rgb if self.brightness is None else affine(rgb, beta=self.brightness)
        if self.contrast is not None and self.contrast_first:
            img = affine(img, alpha=self.contrast)
        if self.saturation is not None:
            hsv = rgb_to_hsv(img)
            hsv[..., 1] = affine(hsv[..., 1], alpha=self.saturation)
            img = hsv_to_rgb(hsv)
        if self.hue is not None:
            hsv = rgb_to_hsv(img)
            hsv[..., 0] = (hsv[..., 0].astype(np.int32) + self.hue) % 180
            img = hsv_to_rgb(hsv)
        if self.contrast is not None and not self.contrast_first:
            img = affine(img, alpha=self.contrast)
        return img


class PhotoMetricDistortion(torch.nn.Module):
    """The distortion on a uint8 (3, H, W) image; the label map passes through."""

    def forward(self, image: tv_tensors.Image, mask: tv_tensors.Mask) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        out = Photometric.sample().apply(image.permute(1, 2, 0).numpy())
        return tv_tensors.wrap(torch.from_numpy(out).permute(2, 0, 1).contiguous(), like=image), mask


def crop_ok(labels: torch.Tensor, cat_max_ratio: float, ignore: int = IGNORE) -> bool:
    """Whether a cropped label map holds two or more classes and none covers ``cat_max_ratio`` of its labels."""
    counts = torch.bincount(labels.flatten().long(), minlength=ignore + 1)
    counts = torch.cat([counts[:ignore], counts[ignore + 1:]])
    counts = counts[counts > 0]
    return len(counts) > 1 and counts.max().item() / counts.sum().item() < cat_max_ratio


def crop_box(mask: torch.Tensor, crop: int, randint: Callable[[int], int], cat_max_ratio: float = CAT_MAX_RATIO,
             ignore: int = IGNORE) -> tuple[int, int, int, int]:
    """(top, left, height, width) of a crop of ``mask`` (H, W), at most ``crop`` a side; ``randint(n)`` draws from
    0..n-1. With ``cat_max_ratio`` < 1 the box is redrawn up to 10 times while the crop fails ``crop_ok``."""
    height, width = mask.shape[-2:]
    ch, cw = min(crop, height), min(crop, width)

    def draw() -> tuple[int, int, int, int]:
        return randint(height - ch + 1), randint(width - cw + 1), ch, cw

    box = draw()
    if cat_max_ratio < 1:
        for _ in range(CROP_RETRIES):
            top, left = box[:2]
            if crop_ok(mask[..., top:top + ch, left:left + cw], cat_max_ratio, ignore):
                break
            box = draw()
    return box


def _torch_randint(n: int) -> int:
    return int(torch.randint(n, ()).item())


class CatMaxRandomCrop(torch.nn.Module):
    """mmseg's random crop of image and label map (no padding: a side shorter than ``crop`` is kept whole)."""

    def __init__(self, crop: int, cat_max_ratio: float = CAT_MAX_RATIO, ignore: int = IGNORE) -> None:
        super().__init__()
        self.crop, self.cat_max_ratio, self.ignore = crop, cat_max_ratio, ignore

    def forward(self, image: tv_tensors.Image, mask: tv_tensors.Mask) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        top, left, h, w = crop_box(mask, self.crop, _torch_randint, self.cat_max_ratio, self.ignore)
        return (tv_tensors.wrap(image[..., top:top + h, left:left + w], like=image),
                tv_tensors.wrap(mask[..., top:top + h, left:left + w], like=mask))


class PadBottomRight(torch.nn.Module):
    """Image and label map padded at the bottom and right to ``size`` × ``size`` (mmseg's ``Pad``): the image with
    ``fill`` (0 after normalisation: the mean colour), the label map with the ignore label."""

    def __init__(self, size: int, fill: float = 0.0, ignore: int = IGNORE) -> None:
        super().__init__()
        self.size, self.fill, self.ignore = size, fill, ignore

    def forward(self, image: tv_tensors.Image, mask: tv_tensors.Mask) -> tuple[tv_tensors.Image, tv_tensors.Mask]:
        pad_h, pad_w = self.size - image.shape[-2], self.size - image.shape[-1]
        if pad_h <= 0 and pad_w <= 0:
            return image, mask
        pad = (0, max(pad_w, 0), 0, max(pad_h, 0))
        return (tv_tensors.wrap(torch.nn.functional.pad(image, pad, value=self.fill), like=image),
                tv_tensors.wrap(torch.nn.functional.pad(mask, pad, value=self.ignore), like=mask))
