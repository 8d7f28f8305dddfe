"""Folder pairs, for segmentation: ``ROOT/images/`` + ``ROOT/masks/`` (or ``labels/``, ``annotations/``), files
matched by name stem, optionally with ``train/`` + ``val/`` below each (the split; else the seeded fraction); labels
0..K-1, 255 = ignore; K from ``ROOT/classes.json`` (a list of names) or ``data.num_classes``. ADE20K's release
layout is such a pair too (``ropim.data.formats.ade20k``). Every pair is listed: an image without a mask, or a mask
without an image, is refused before a job starts. No torch, no Ray, no MLflow."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ropim.data.formats.common import IMAGE_DIRS, MASK_DIRS, SEGMENT, Source, class_names, is_image
from ropim.data.lists import FileSegList
from ropim.errors import ConfigError
from ropim.paths import resolve_path

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import SegDataConfig

NAME = "pairs"
TASKS = (SEGMENT,)
SPLIT_DIRS = {"train": ("training", "train"), "val": ("validation", "val")}


def detect(path: str) -> bool:
    """Any folder (the segmentation formats' last resort; listing says what it lacks)."""
    return os.path.isdir(path)


def check(cfg: SegDataConfig) -> None:
    """Nothing cheaper than listing the pairs (``ropim.data.sources.check_source`` lists and samples them)."""


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
    """Class names from ROOT/classes.json, else ``data.num_classes`` or ``default`` numbered names (ADE20K's from 1:
    its stored labels)."""
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
    return [str(i + 1) for i in range(n)] if default else [str(i) for i in range(n)]


def folder_pairs(cfg: SegDataConfig, name: str, image_dir: str, mask_dir: str, default_classes: int | None = None
                 ) -> Source:
    """The pairs of ``image_dir`` and ``mask_dir`` (split by their ``training``/``validation`` or ``train``/``val``
    folders where both have them); ``default_classes`` set: ADE20K's labels (0 ignore, 1..K)."""
    root = resolve_path(cfg.source)
    classes = folder_classes(root, cfg, default_classes)
    subdirs = {s: next((n for n in names if os.path.isdir(os.path.join(image_dir, n))), None)
               for s, names in SPLIT_DIRS.items()}
    found = {s: (os.path.join(image_dir, d), os.path.join(mask_dir, d)) for s, d in subdirs.items()} \
        if all(subdirs.values()) else {"all": (image_dir, mask_dir)}
    pools = {}
    for split, dirs in found.items():
        imgs, masks = (rel(root, files) for files in matched_pairs(*dirs))
        pools[split] = FileSegList(root, imgs, masks, len(classes), default_classes is not None)
    return Source(name, root, classes, cfg, pools)


def rel(root: str, files: list[str]) -> list[str]:
    return [os.path.relpath(f, root).replace(os.sep, "/") for f in files]


def source(cfg: SegDataConfig, img_size: int = 32) -> Source:
    """The pairs of ROOT/images/ and ROOT/masks/ (``img_size``: unused, transforms resize)."""
    root = resolve_path(cfg.source)
    return folder_pairs(cfg, NAME, folder_of(root, IMAGE_DIRS, "images"), folder_of(root, MASK_DIRS, "masks"))
