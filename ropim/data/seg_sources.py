"""Segmentation sources: what each split holds (image + label-map pairs), their classes, and the checks that run
before a job starts. No torch, no Ray, no MLflow.

Formats (``SegDataConfig.format``; ``auto`` detects them in this order):

* ``digits``  the built-in digits canvases (``source="digits"``, ``ropim.data.seg_digits``).
* ``parquet`` shards with ``image`` and ``mask`` (PNG) columns and ``path``, written by ``ropim data convert --task
              segment``; class names in the schema metadata; ``train-*`` / ``val-*`` files are the split.
* ``ade20k``  the ADE20K release: ``ROOT/images/{training,validation}/*.jpg`` + ``ROOT/annotations/{training,
              validation}/*.png``; label 0 = ignore, 1..150 = classes (shifted to 0..149, 0 → 255).
* ``pairs``   ``ROOT/images/`` + ``ROOT/masks/`` (or ``labels/``, ``annotations/``), files matched by name stem,
              optionally with ``train/`` + ``val/`` below each; labels 0..K-1, 255 = ignore; K from
              ``ROOT/classes.json`` (a list of names) or ``data.num_classes``.

Every pair is listed (an image without a mask, or a mask without an image, is refused before a job starts) and a
sample of ``check_pairs`` is decoded (sizes equal, labels below K or 255); loading checks every pair again.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from ropim.data import footers
from ropim.data.config import DataConfig
from ropim.data.decode import decode_rgb
from ropim.data.layout import is_image, parquet_files, parquet_split_of
from ropim.data.lists import split_indices
from ropim.data.sources import class_names, in_val
from ropim.errors import ConfigError
from ropim.paths import is_uri

SegDataConfig = DataConfig  # ropim.data.seg_config's subclass, which imports this module to check a source

IGNORE = 255
ADE_CLASSES = 150
IMAGE_DIRS, MASK_DIRS = ("images", "imgs", "img"), ("masks", "labels", "annotations")
SPLIT_DIRS = {"train": ("training", "train"), "val": ("validation", "val")}


class SegList:
    """Random access to a split's pairs: ``paths`` (one per pair), ``load(i)`` → (RGB PIL image, (H, W) uint8 labels
    in 0..K-1 or 255), checked: ConfigError naming the pair when the sizes differ or a label is out of range."""

    def __init__(self, paths: list[str], num_classes: int, reduce_zero_label: bool = False) -> None:
        self.paths, self.num_classes, self.reduce_zero_label = list(paths), num_classes, reduce_zero_label

    def __len__(self) -> int:
        return len(self.paths)

    def raw(self, i: int) -> tuple[bytes | np.ndarray, bytes | np.ndarray]:
        raise NotImplementedError

    def load(self, i: int, max_pixels: int = 25_000_000) -> tuple[Image.Image, np.ndarray]:
        image_data, mask_data = self.raw(i)
        image = decode_rgb(image_data, max_pixels)
        mask = mask_data if isinstance(mask_data, np.ndarray) else np.asarray(Image.open(io.BytesIO(mask_data)))
        if mask.ndim != 2:
            raise ConfigError(f"mask of {self.paths[i]}: {mask.shape} is not a single-channel label map")
        if self.reduce_zero_label:  # ADE20K: 0 = ignore, 1..K = classes
            mask = np.where(mask == 0, IGNORE, mask.astype(np.int64) - 1)
        mask = mask.astype(np.uint8) if mask.max(initial=0) <= 255 else mask
        return image, check_pair(self.paths[i], image.size, mask, self.num_classes, self.reduce_zero_label)


def check_pair(path: str, size: tuple[int, int], mask: np.ndarray, num_classes: int, shifted: bool) -> np.ndarray:
    """``mask`` when it fits the image of ``size`` (W, H) and holds labels < K or 255; ConfigError otherwise."""
    if mask.shape != (size[1], size[0]):
        raise ConfigError(f"{path}: mask is {mask.shape[1]}x{mask.shape[0]} but the image is {size[0]}x{size[1]}; "
                          "a mask must have its image's size (fix or remove the pair)")
    bad = (mask >= num_classes) & (mask != IGNORE)
    if bad.any():
        shown = int(mask[bad].max()) + (1 if shifted else 0)
        allowed = f"1..{num_classes} (0 = ignore)" if shifted else f"0..{num_classes - 1} (255 = ignore)"
        raise ConfigError(f"{path}: mask holds label {shown}, outside the {num_classes} classes {allowed}; fix the "
                          "mask or set data.num_classes")
    return mask


class ArraySegList(SegList):
    """Pairs held as arrays (the built-in digits canvases)."""

    def __init__(self, images: np.ndarray, masks: np.ndarray, paths: list[str], num_classes: int) -> None:
        super().__init__(paths, num_classes)
        self.images, self.masks = images, masks

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.images[i], self.masks[i]


class FileSegList(SegList):
    """Pairs of files: ``paths`` are the images, ``masks`` their label maps (absolute paths)."""

    def __init__(self, images: list[str], masks: list[str], num_classes: int, reduce_zero_label: bool) -> None:
        super().__init__(images, num_classes, reduce_zero_label)
        self.masks = masks

    def raw(self, i: int) -> tuple[bytes, bytes]:
        with open(self.paths[i], "rb") as f, open(self.masks[i], "rb") as g:
            return f.read(), g.read()


class ParquetSegList(SegList):
    """Rows of Parquet shards (``image``, ``mask``); one file's selected rows are read at a time and cached."""

    def __init__(self, fs, files: list[str], rows: list[np.ndarray], paths: list[str], num_classes: int) -> None:
        super().__init__(paths, num_classes)
        self.fs, self.files, self.rows = fs, files, rows
        self.offsets = np.cumsum([0] + [len(r) for r in rows])
        self.cache: tuple[int, dict] | None = None

    def raw(self, i: int) -> tuple[bytes, bytes]:
        f = int(np.searchsorted(self.offsets, i, side="right")) - 1
        if self.cache is None or self.cache[0] != f:
            table = footers.read_columns(self.fs, self.files[f], ["image", "mask"])
            self.cache = (f, table.take(self.rows[f]).to_pydict())
        j = i - int(self.offsets[f])
        return self.cache[1]["image"][j], self.cache[1]["mask"][j]

    def __getstate__(self):  # DataLoader workers read their own copy
        return {**self.__dict__, "cache": None}


@dataclass
class SegSource:
    """An opened segmentation source: format, class names and its pairs per split ('train'/'val')."""

    format: str
    location: str
    classes: list[str]
    splits: dict[str, SegList] = field(default_factory=dict)


def detect_seg_format(cfg: SegDataConfig) -> str:
    """The format of ``cfg.source`` (forced or detected); ConfigError naming the path otherwise."""
    if cfg.source == "digits" and cfg.format in ("auto", "digits"):
        return "digits"
    if cfg.format == "digits":
        raise ConfigError(f"data source {cfg.source!r} with format=digits: use source=digits")
    if is_uri(cfg.source) or cfg.format == "parquet" or cfg.source.endswith(".parquet"):
        return "parquet"
    root = os.path.abspath(os.path.expanduser(cfg.source))
    if not os.path.isdir(root):
        raise ConfigError(f"data source {cfg.source!r}: no such folder; give 'digits', an ADE20K folder "
                          "(images/ + annotations/), an images/ + masks/ folder pair, or Parquet shards")
    if cfg.format != "auto":
        return cfg.format
    if any(f.endswith(".parquet") for f in os.listdir(root)):
        return "parquet"
    ade = all(os.path.isdir(os.path.join(root, d, "training")) for d in ("images", "annotations"))
    return "ade20k" if ade else "pairs"


def folder_of(root: str, names: tuple[str, ...], what: str) -> str:
    """The first of ``names`` that is a folder under ``root``; ConfigError naming the layout otherwise."""
    for n in names:
        if os.path.isdir(os.path.join(root, n)):
            return os.path.join(root, n)
    raise ConfigError(f"data source {root!r}: no {what} folder ({' or '.join(n + '/' for n in names)}); a folder "
                      "pair needs ROOT/images/ and ROOT/masks/ (or the ADE20K layout images/ + annotations/)")


def stems(folder: str, images: bool) -> dict[str, str]:
    """{name stem: path} of the images (or the masks: PNG files) directly in ``folder``."""
    found = {}
    for name in sorted(os.listdir(folder)):
        if not name.startswith(".") and (is_image(name) if images else name.lower().endswith(".png")):
            found[os.path.splitext(name)[0]] = os.path.join(folder, name)
    return found


def matched_pairs(image_dir: str, mask_dir: str) -> tuple[list[str], list[str]]:
    """(images, masks) of the same stems; ConfigError naming the first image without a mask, or the reverse."""
    imgs, masks = stems(image_dir, True), stems(mask_dir, False)
    for a, b, what in ((imgs, masks, "has no mask in"), (masks, imgs, "has no image in")):
        lonely = sorted(set(a) - set(b))
        if lonely:
            other = mask_dir if what == "has no mask in" else image_dir
            raise ConfigError(f"{a[lonely[0]]} {what} {other} ({len(lonely)} such file(s)); every image needs a "
                              "mask of the same name (.png) and every mask an image")
    if not imgs:
        raise ConfigError(f"data source: no images in {image_dir}")
    keys = sorted(imgs)
    return [imgs[k] for k in keys], [masks[k] for k in keys]


def folder_classes(root: str, cfg: SegDataConfig, default: int | None) -> list[str]:
    """Class names from ROOT/classes.json, else ``data.num_classes`` or ``default`` numbered names."""
    path = os.path.join(root, "classes.json")
    if os.path.isfile(path):
        with open(path) as f:
            names = class_names(json.load(f), path)
        if cfg.num_classes is not None and cfg.num_classes != len(names):
            raise ConfigError(f"data.num_classes={cfg.num_classes} but {path} names {len(names)} classes")
        return names
    n = cfg.num_classes or default
    if n is None:
        raise ConfigError(f"data source {cfg.source!r}: how many classes? give data.num_classes (labels 0..K-1, "
                          "255 = ignore) or ROOT/classes.json with the class names")
    return [str(i + 1) for i in range(n)] if default == ADE_CLASSES else [str(i) for i in range(n)]


def open_folders(cfg: SegDataConfig, fmt: str) -> SegSource:
    """An ADE20K-layout or folder-pair source."""
    root = os.path.abspath(os.path.expanduser(cfg.source))
    ade = fmt == "ade20k"
    image_dir = os.path.join(root, "images") if ade else folder_of(root, IMAGE_DIRS, "images")
    mask_dir = os.path.join(root, "annotations") if ade else folder_of(root, MASK_DIRS, "masks")
    classes = folder_classes(root, cfg, ADE_CLASSES if ade else None)
    subdirs = {s: next((n for n in names if os.path.isdir(os.path.join(image_dir, n))), None)
               for s, names in SPLIT_DIRS.items()}
    splits = {}
    if all(subdirs.values()):
        for s, d in subdirs.items():
            imgs, masks = matched_pairs(os.path.join(image_dir, d), os.path.join(mask_dir, d))
            splits[s] = FileSegList(imgs, masks, len(classes), ade)
    else:
        imgs, masks = matched_pairs(image_dir, mask_dir)
        val = in_val([os.path.relpath(p, root) for p in imgs], cfg.split_seed, cfg.val_fraction)
        for s, keep in (("train", ~val), ("val", val)):
            idx = np.flatnonzero(keep)
            splits[s] = FileSegList([imgs[i] for i in idx], [masks[i] for i in idx], len(classes), ade)
    return SegSource(fmt, root, classes, splits)


def open_parquet(cfg: SegDataConfig) -> SegSource:
    """Parquet shards with image + mask columns."""
    fs, files = parquet_files(cfg.source)
    schema = footers.schema(fs, files[0])
    missing = [c for c in ("image", "mask") if c not in schema.names]
    if missing:
        raise ConfigError(f"data source {cfg.source!r}: {files[0]} has no {' / '.join(missing)} column (columns: "
                          f"{', '.join(schema.names)}); write shards with `ropim data convert SRC DST --task segment`")
    meta = schema.metadata or {}
    classes = class_names(json.loads(meta[b"classes"]), files[0]) if b"classes" in meta else \
        [str(i) for i in range(cfg.num_classes or 0)]
    if not classes:
        raise ConfigError(f"data source {cfg.source!r}: no class names in the shards' metadata; set data.num_classes")
    own = {s: [f for f in files if (parquet_split_of(f) or "train") == s] for s in ("train", "val")}
    splits = {}
    for s in ("train", "val"):
        chosen = own[s] if own["val"] else files
        rows, paths = [], []
        for f in chosen:
            names = footers.read_columns(fs, f, ["path"])["path"].to_pylist()
            idx = np.arange(len(names))
            if not own["val"]:
                idx = idx[in_val(names, cfg.split_seed, cfg.val_fraction) == (s == "val")]
            rows.append(idx)
            paths += [names[i] for i in idx]
        splits[s] = ParquetSegList(fs, chosen, rows, paths, len(classes))
    return SegSource("parquet", cfg.source, classes, splits)


def open_seg_source(cfg: SegDataConfig) -> SegSource:
    """List the source's pairs per split (no decoding); ConfigError when a split is empty."""
    fmt = detect_seg_format(cfg)
    if fmt == "digits":
        from ropim.data.seg_digits import CLASSES, digit_canvases

        images, masks = digit_canvases(cfg.canvases, cfg.canvas_size, cfg.split_seed)
        paths = [f"digits-canvas/{i:05d}" for i in range(len(images))]
        idx = split_indices(len(images), cfg.val_fraction, cfg.split_seed)
        src = SegSource(fmt, "digits", list(CLASSES), {
            s: ArraySegList(images[i], masks[i], [paths[k] for k in i], len(CLASSES)) for s, i in idx.items()})
    elif fmt == "parquet":
        src = open_parquet(cfg)
    else:
        src = open_folders(cfg, fmt)
    for s, pairs in src.splits.items():
        if len(pairs) == 0:
            raise ConfigError(f"data source {cfg.source!r}: split {s!r} holds no pairs; add pairs or change "
                              "data.val_fraction")
    return src


def check_seg_source(cfg: SegDataConfig) -> SegSource | None:
    """List every pair and decode ``check_pairs`` of each split, spread evenly (sizes, label range); nothing to check
    for the built-in digits (None)."""
    if detect_seg_format(cfg) == "digits":
        return None
    src = open_seg_source(cfg)
    for pairs in src.splits.values():
        n = min(len(pairs), cfg.check_pairs)
        for i in np.unique(np.linspace(0, len(pairs) - 1, n).round().astype(int)) if n else []:
            try:
                pairs.load(int(i), cfg.max_pixels)
            except ConfigError:
                raise
            except Exception as err:  # noqa: BLE001 — an unreadable or undecodable file
                raise ConfigError(f"{pairs.paths[int(i)]}: cannot read the image or its mask ({err}); fix or remove "
                                  "the pair") from None
    return src
