"""The built-in data (``source="digits"``), needing no download: scikit-learn's 8×8 digits, upscaled to RGB images
with their class (classification), or composited onto larger canvases with per-pixel labels (segmentation:
0 = background, 1..10 = digits 0..9). Deterministic from a seed; split by a seeded permutation.

Each canvas has a smooth random background colour gradient with noise; 1–4 digits, each upscaled to a random size
(a quarter to a half of the canvas side), coloured, are pasted at random places (later ones on top). A pixel is a
digit's where that digit's upscaled stroke intensity exceeds 0.35, so strokes, not boxes, are labelled.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ropim.data.formats.common import CLASSIFY, SEGMENT, Source, class_names, split_indices
from ropim.data.lists import ArrayList, Items
from ropim.data.pair_lists import ArraySegList

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import DataConfig

NAME = "digits"
TASKS = (CLASSIFY, SEGMENT)
CLASSES = ["background"] + [f"digit {d}" for d in range(10)]  # segmentation's
CANVASES = "the built-in digits canvas set"  # what messages call them
THRESHOLD = 0.35


def detect(path: str) -> bool:
    """Never a path: the built-in data is ``source="digits"`` (``ropim.data.sources``)."""
    return False


def check(cfg: DataConfig) -> None:
    """Nothing on disk to check; the canvases' classes against ``data.num_classes`` (segmentation)."""
    if cfg.TASK == SEGMENT:
        class_names(list(CLASSES), CANVASES, cfg.num_classes)


def digit_strokes() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: intensities (N, 8, 8) in [0, 1] and their labels (N,)."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: nothing is downloaded

    digits = load_digits()
    return (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)


def load_digits(size: int = 32) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """scikit-learn digits as uint8 (1797, size, size, 3) images, int64 labels, class names."""
    import torch
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.from_numpy(bunch.images).float().unsqueeze(1) * (255.0 / 16.0)  # (N, 1, 8, 8) in [0, 255]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1)  # (N, 3, size, size)
    return x.permute(0, 2, 3, 1).contiguous().numpy(), bunch.target.astype(np.int64), [str(d) for d in range(10)]


def count(cfg: DataConfig) -> int:
    """How many items the built-in data holds, without building them (no torch, no resize): scikit-learn's images,
    or ``cfg.canvases``."""
    return cfg.canvases if cfg.TASK == SEGMENT else len(digit_strokes()[1])


def canvas(rng: np.random.Generator, strokes: np.ndarray, labels: np.ndarray, size: int
           ) -> tuple[np.ndarray, np.ndarray]:
    """One canvas: RGB uint8 (size, size, 3) and its label map uint8 (size, size)."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    t = (yy if rng.random() < 0.5 else xx)[..., None]
    img = c0 * (1 - t) + c1 * t + rng.normal(0, 8, (size, size, 3))  # (size, size, 3)
    mask = np.zeros((size, size), np.uint8)
    for _ in range(rng.integers(1, 5)):
        k = rng.integers(len(labels))
        side = int(rng.integers(size // 4, size // 2 + 1))
        stroke = np.asarray(Image.fromarray(strokes[k]).resize((side, side), Image.BILINEAR))  # (side, side)
        y, x = rng.integers(0, size - side + 1, 2)
        colour = rng.uniform(0, 255, 3)
        if np.abs(colour - img[y:y + side, x:x + side].mean((0, 1))).sum() < 120:  # keep digits visible
            colour = 255 - colour
        alpha = np.clip(stroke, 0, 1)[..., None]
        img[y:y + side, x:x + side] = img[y:y + side, x:x + side] * (1 - alpha) + colour * alpha
        mask[y:y + side, x:x + side][stroke > THRESHOLD] = labels[k] + 1
    return np.clip(img, 0, 255).astype(np.uint8), mask


@lru_cache(maxsize=2)
def digit_canvases(n: int, size: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` canvases: images uint8 (n, size, size, 3) and label maps uint8 (n, size, size), the same for a seed
    (cached: a process builds them once; do not write into them)."""
    strokes, labels = digit_strokes()
    rng = np.random.default_rng(seed)
    pairs = [canvas(rng, strokes, labels, size) for _ in range(n)]
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


class DigitsSource(Source):
    """The built-in digits, split by the seeded permutation of ``split_indices``."""

    def in_val(self, pool: Items) -> np.ndarray:
        mask = np.zeros(len(pool), dtype=bool)
        mask[split_indices(len(pool), self.cfg.val_fraction, self.cfg.split_seed)["val"]] = True
        return mask


def source(cfg: DataConfig, img_size: int = 32) -> Source:
    """The digits at ``img_size`` (classification), or ``cfg.canvases`` canvases (segmentation)."""
    if cfg.TASK == SEGMENT:
        images, masks = digit_canvases(cfg.canvases, cfg.canvas_size, cfg.split_seed)
        paths = [f"digits-canvas/{i:05d}" for i in range(len(images))]
        classes = class_names(list(CLASSES), CANVASES, cfg.num_classes)
        return DigitsSource(NAME, NAME, classes, cfg, {"all": ArraySegList(images, masks, paths, len(classes))})
    images, labels, classes = load_digits(img_size)
    paths = [f"digits/{i:04d}.png" for i in range(len(labels))]
    return DigitsSource(NAME, NAME, classes, cfg, {"all": ArrayList(images, labels, paths, classes)})
