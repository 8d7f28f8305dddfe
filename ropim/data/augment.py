"""The paper's pretraining augmentation and the evaluation's resize + centre crop, in PIL + numpy (no torch import).

RandomResizedCrop(scale 0.67–1, ratio 3/4–4/3) samples its box exactly as torchvision does (10 attempts, then
a centre crop clamped to the ratio range) and crops + resizes in one antialiased bilinear PIL call; then a
horizontal flip with p = 0.5; normalization with the ImageNet mean/std works on whole uint8 batches. Without
torch, Ray Data's decode workers start in a fraction of the time (they import this module, not torch), and
the per-image cost is lower than torchvision's tensor pipeline. ``ropim.data.pretrain_transform`` wraps the
same functions for torch datasets, so both paths augment identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_SCALE = (0.67, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
EVAL_RESIZE = 256 / 224  # the evaluation's short side over its centre crop, at sizes over SMALL
SMALL = 32  # sizes an evaluation resizes whole (the official code's CIFAR rule: no crop at 32 or less)
PIXEL_MEAN = np.array(IMAGENET_MEAN, np.float32) * 255  # on uint8 pixel values: (x - PIXEL_MEAN) * PIXEL_INV_STD
PIXEL_INV_STD = 1 / (np.array(IMAGENET_STD, np.float32) * 255)


def crop_box(width: int, height: int, uniform: Callable[[], float], scale=CROP_SCALE,
             ratio=CROP_RATIO) -> tuple[int, int, int, int]:
    """(left, top, crop width, crop height) of a random resized crop — torchvision's sampling rule.

    ``uniform()`` returns floats in [0, 1): pass the RNG of the calling process (torch in DataLoader
    workers, numpy in Ray tasks).
    """
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * (scale[0] + (scale[1] - scale[0]) * uniform())
        aspect = math.exp(log_lo + (log_hi - log_lo) * uniform())
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(uniform() * (height - h + 1)), height - h)
            left = min(int(uniform() * (width - w + 1)), width - w)
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def augment(img: Image.Image, size: int, uniform: Callable[[], float]) -> np.ndarray:
    """Random resized crop to size×size + horizontal flip: uint8 (size, size, 3)."""
    left, top, w, h = crop_box(img.width, img.height, uniform)
    out = img.resize((size, size), Image.BILINEAR, box=(left, top, left + w, top + h))
    arr = np.asarray(out)
    return arr[:, ::-1] if uniform() < 0.5 else arr


def resize(img: Image.Image, size: int) -> np.ndarray:
    """The evaluation's view of an image, uint8 (size, size, 3), as the official fine-tuning evaluates: over 32
    pixels, the short side resized (bicubic) to ``int(EVAL_RESIZE · size)`` and the centre size×size cropped (ImageNet's
    256 → 224); at 32 or less (CIFAR, the digits) the whole image resized (bilinear) to size×size."""
    if img.size == (size, size) and size <= SMALL:
        return np.asarray(img)
    if size <= SMALL:
        return np.asarray(img.resize((size, size), Image.BILINEAR))
    short, (w, h) = int(EVAL_RESIZE * size), img.size
    w, h = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)  # torchvision's Resize(int) sizes
    left, top = int(round((w - size) / 2)), int(round((h - size) / 2))  # and CenterCrop's box
    return np.asarray(img.resize((w, h), Image.BICUBIC).crop((left, top, left + size, top + size)))


def normalize(batch: np.ndarray) -> np.ndarray:
    """uint8 (N, H, W, 3) or (H, W, 3) → float32 (N, 3, H, W) / (3, H, W), ImageNet-normalized."""
    x = (batch.astype(np.float32) - PIXEL_MEAN) * PIXEL_INV_STD
    return np.ascontiguousarray(np.moveaxis(x, -1, -3))
