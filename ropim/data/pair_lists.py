"""What a segmentation split holds, listed, not decoded: images with label maps (``SegList``), held as arrays (the
built-in digits canvases) or pairs of files under a root; Parquet shards' are ``ropim.data.formats.parquet_rows``'.
Each gives its files' data (``raw``), the pair decoded and checked (``load``) and the Parquet row ``ropim data
convert`` writes of it (``row``). No torch, no Ray, no MLflow."""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
from PIL import Image

from ropim.data.decode import DEFAULT_MAX_PIXELS, BadImages, decode_mask, decode_rgb, label_map, reason
from ropim.data.item_paths import ItemPaths
from ropim.data.lists import Items, png, vanished
from ropim.errors import ConfigError

IGNORE = 255  # the label of pixels that count for no class


class SegList(Items):
    """Random access to a split's pairs: ``paths`` (one per pair), ``load(i)`` → (RGB PIL image, (H, W) uint8 labels
    in 0..K-1 or 255), checked: ConfigError naming the pair when the sizes differ or a label is out of range.
    ``reduce_zero_label`` (ADE20K): stored label 0 is ignore and 1..K are the classes."""

    SCHEMA = pa.schema([("image", pa.binary()), ("mask", pa.binary()), ("path", pa.string())])
    UNIT = "pair"
    SHARED = ("num_classes",)

    def __init__(self, paths: Iterable[str], num_classes: int, reduce_zero_label: bool = False) -> None:
        self.paths, self.num_classes, self.reduce_zero_label = ItemPaths(paths), num_classes, reduce_zero_label

    def raw(self, i: int) -> tuple[bytes | np.ndarray, bytes | np.ndarray]:
        raise NotImplementedError

    def sample(self, k: int) -> list[int]:
        """Up to ``k`` pairs to check before a run, spread evenly over the list."""
        return np.unique(np.linspace(0, len(self) - 1, min(k, len(self))).round().astype(int)).tolist() if k else []

    def mask_name(self, i: int) -> str:
        """What messages call pair ``i``'s mask (its file where it has one)."""
        return f"mask of {self.paths[i]}"

    def load(self, i: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[Image.Image, np.ndarray]:
        return self.decoded(i, *self.raw(i), max_pixels)

    def decoded(self, i: int, image_data: bytes | np.ndarray, mask_data: bytes | np.ndarray,
                max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[Image.Image, np.ndarray]:
        """Pair ``i`` from its files' data (``raw``): the image, and its label map checked against it."""
        try:
            image = decode_rgb(image_data, max_pixels)
        except Exception as err:  # noqa: BLE001 — the pair is bad; say which of its files
            raise ValueError(f"image {self.paths[i]}: {reason(err)}") from None
        name = self.mask_name(i)
        mask = label_map(mask_data, name) if isinstance(mask_data, np.ndarray) else \
            decode_mask(mask_data, name, max_pixels)
        if self.reduce_zero_label:  # ADE20K: 0 = ignore, 1..K = classes
            mask = np.where(mask == 0, IGNORE, mask.astype(np.int64) - 1)
        mask = mask.astype(np.uint8) if mask.max(initial=0) <= 255 else mask
        return image, check_pair(name, image.size, mask, self.num_classes, self.reduce_zero_label, self.paths[i])

    def row(self, i: int, bad: BadImages) -> dict | None:
        """Pair ``i``'s image bytes, label map (checked, as PNG) and path; an unreadable pair stops the conversion,
        an undecodable one follows the policy."""
        try:
            image_data, mask_data = self.raw(i)
        except OSError as err:
            raise vanished(self.paths[i], err) from None
        try:
            _, mask = self.decoded(i, image_data, mask_data, bad.max_pixels)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001 — an undecodable file makes the pair bad
            bad.add(self.paths[i], err)
            return None
        return {"image": png(image_data), "mask": png(mask.astype(np.uint8)), "path": self.stored_path(i)}


def check_pair(name: str, size: tuple[int, int], mask: np.ndarray, num_classes: int, shifted: bool,
               image: str = "") -> np.ndarray:
    """``mask`` (``name``: its file) when it fits the image (``image``) of ``size`` (W, H) and holds labels < K or
    255; ConfigError naming it otherwise."""
    if mask.shape != (size[1], size[0]):
        raise ConfigError(f"{name}: mask is {mask.shape[1]}x{mask.shape[0]} but the image is {size[0]}x{size[1]}"
                          f"{f' ({image})' if image else ''}; a mask must have its image's size (fix or remove the "
                          "pair)")
    bad = (mask >= num_classes) & (mask != IGNORE)
    if bad.any():
        shown = int(mask[bad].max()) + (1 if shifted else 0)
        allowed = f"1..{num_classes} (0 = ignore)" if shifted else f"0..{num_classes - 1} (255 = ignore)"
        raise ConfigError(f"{name}: mask holds label {shown}, outside the {num_classes} classes {allowed}; fix the "
                          "mask or set data.num_classes")
    return mask


class ArraySegList(SegList):
    """Pairs held as arrays (the built-in digits canvases)."""

    PER_ITEM = ("images", "masks", "paths")

    def __init__(self, images: np.ndarray, masks: np.ndarray, paths: Iterable[str], num_classes: int) -> None:
        super().__init__(paths, num_classes)
        self.images, self.masks = images, masks

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.images[i], self.masks[i]



class FileSegList(SegList):
    """Pairs of files under ``root``: ``paths`` the images', ``masks`` their label maps', relative to it."""

    PER_ITEM = ("paths", "masks")
    SHARED = ("root", "num_classes", "reduce_zero_label")

    def __init__(self, root: str, paths: Iterable[str], masks: Iterable[str], num_classes: int,
                 reduce_zero_label: bool) -> None:
        super().__init__(paths, num_classes, reduce_zero_label)
        self.root, self.masks = root, ItemPaths(masks)

    def mask_name(self, i: int) -> str:
        return self.masks[i]

    def raw(self, i: int) -> tuple[bytes, bytes]:
        with open(os.path.join(self.root, self.paths[i]), "rb") as f, \
                open(os.path.join(self.root, self.masks[i]), "rb") as g:
            return f.read(), g.read()

