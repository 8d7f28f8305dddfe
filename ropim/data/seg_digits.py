"""The built-in segmentation set, needing no download: scikit-learn's 8×8 digits composited onto larger canvases,
with per-pixel labels (0 = background, 1..10 = digits 0..9). Deterministic from a seed.

Each canvas has a smooth random background colour gradient with noise; 1–4 digits, each upscaled to a random size
(a quarter to a half of the canvas side), coloured, are pasted at random places (later ones on top). A pixel is a
digit's where that digit's upscaled stroke intensity exceeds 0.35, so strokes, not boxes, are labelled.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

CLASSES = ["background"] + [f"digit {d}" for d in range(10)]
THRESHOLD = 0.35


def digit_strokes() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: intensities (N, 8, 8) in [0, 1] and their labels (N,)."""
    from sklearn.datasets import load_digits  # bundled with scikit-learn: nothing is downloaded

    digits = load_digits()
    return (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)


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
