"""Fixtures: an ImageFolder with a corrupt JPEG and Parquet shards with their own split (``sample_data``)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from sample_data import encode, pixels, write_parquet


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """ImageFolder: cat/ (PNG, one greyscale, one palette), dog/ (JPEG, one RGBA PNG, one WebP), one corrupt JPEG.

    Returns (root, {relative path: label} of the good images, relative path of the corrupt one).
    """
    root = tmp_path_factory.mktemp("folder")
    good = {}
    files = {
        "cat/c0.png": Image.fromarray(pixels(20, 16, 1)),
        "cat/c1.png": Image.fromarray(pixels(24, 24, 2)),
        "cat/grey.png": Image.fromarray(pixels(18, 18, 3)[..., 0], mode="L"),
        "cat/sub/palette.png": Image.fromarray(pixels(16, 16, 4)).convert("P"),
        "dog/d0.jpg": Image.fromarray(pixels(32, 32, 5)),
        "dog/d1.jpeg": Image.fromarray(pixels(30, 28, 6)),
        "dog/rgba.png": Image.fromarray(np.dstack([pixels(16, 20, 7), np.full((16, 20), 128, np.uint8)]),
                                        mode="RGBA"),
        "dog/d2.webp": Image.fromarray(pixels(16, 16, 8)),
    }
    for rel, img in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        img.save(root / rel)
        good[rel] = 0 if rel.startswith("cat") else 1
    jpeg = encode(Image.fromarray(pixels(32, 32, 9)), "JPEG")
    (root / "dog" / "broken.jpg").write_bytes(jpeg[: len(jpeg) // 2])  # truncated: the header reads fine
    (root / "dog" / "notes.txt").write_text("not an image")  # ignored: not an image extension
    return root, good, "dog/broken.jpg"


@pytest.fixture(scope="module")
def parquet_set(tmp_path_factory):
    """Parquet shards with their own split (train-*, val-*), classes in the schema metadata. 40 + 10 rows."""
    root = tmp_path_factory.mktemp("pq")
    rows = {"train": [], "val": []}
    for split, n in (("train", 40), ("val", 10)):
        for i in range(n):
            label = i % 3
            rows[split].append((encode(Image.fromarray(pixels(32, 32, 1000 + i + 100 * len(split))), "JPEG"),
                                label, f"{split}/{label}/{i:03d}.jpg"))
    write_parquet(root / "train-00000.parquet", rows["train"][:25], ["a", "b", "c"])
    write_parquet(root / "train-00001.parquet", rows["train"][25:], ["a", "b", "c"])
    write_parquet(root / "val-00000.parquet", rows["val"], ["a", "b", "c"])
    return root, rows
