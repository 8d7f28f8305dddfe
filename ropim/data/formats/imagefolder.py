"""ImageFolder trees, for classification: ``ROOT/<class>/<image>`` (any depth below the class folder), or
``ROOT/train/<class>/…`` and ``ROOT/val/<class>/…`` (its own split). JPEG/PNG/WebP/BMP/GIF; greyscale, RGBA and
palette images become RGB. No torch, no Ray, no MLflow."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

from ropim.data.formats.common import (
    CLASSIFY,
    IMAGE_DIRS,
    IMAGE_EXTENSIONS,
    MASK_DIRS,
    VAL_NAMES,
    Listing,
    Source,
    in_val,
    is_folder,
    is_image,
    relative,
)
from ropim.data.lists import FileList
from ropim.errors import ConfigError
from ropim.paths import resolve_path

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import DataConfig

NAME = "imagefolder"
TASKS = (CLASSIFY,)
LAYOUT = "an ImageFolder needs ROOT/<class>/<image> (or ROOT/train/<class>/… and ROOT/val/<class>/…)"


def walk_images(folder: str, listing: Listing) -> Iterator[str]:
    """Image files below ``folder`` (sorted, recursive, a folder's files before its sub-folders') that ``listing``
    allows and meets first (its link rule), as they are met: a caller that stops early reads no further folder.
    One ``scandir`` per folder: only links are resolved (``realpath``), so a file costs no stat call (resolving every
    file's path stat-ed each of its parent folders: 3.9 s for 200k files, 0.6 s without)."""
    stack = [(folder, os.path.realpath(folder))]
    while stack:
        dirpath, real = stack.pop()
        if not (listing.allowed(dirpath, real) and listing.first(real)):
            continue
        try:
            with os.scandir(dirpath) as entries:
                found = sorted(entries, key=lambda e: e.name)
        except OSError as err:  # its images are left out, and the listing's notes say so
            listing.unlisted.append((dirpath, err))
            continue
        subfolders = []
        for entry in found:
            if not listing.named(entry.path):
                continue
            target = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(real, entry.name)
            if is_folder(entry):
                if not entry.name.startswith("."):
                    subfolders.append((entry.path, target))
            elif not is_image(entry.name):
                listing.passed_over(entry.name)
            elif entry.is_symlink() and not os.path.exists(target):
                listing.unlisted.append((entry.path, FileNotFoundError(errno.ENOENT, "a link that leads nowhere")))
            elif listing.allowed(entry.path, target) and listing.take(entry.path, target, entry.is_symlink()):
                yield entry.path
        stack += reversed(subfolders)


def subdirs(folder: str) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def imagefolder_splits(root: str) -> dict[str, str]:
    """{'train': dir, 'val': dir} for ROOT/train + ROOT/val layouts, else {'all': ROOT (or ROOT/train)}."""
    train = os.path.join(root, "train")
    val = next((os.path.join(root, v) for v in VAL_NAMES if os.path.isdir(os.path.join(root, v))), None)
    if os.path.isdir(train) and subdirs(train):
        return {"train": train, "val": val} if val else {"all": train}
    return {"all": root}


def detect(path: str) -> bool:
    """Any folder (the classification formats' last resort; ``check`` says what it lacks)."""
    return os.path.isdir(path)


def check(cfg: DataConfig) -> None:
    """Every split folder holds a class folder with an image (stopping at the first: fast on large trees)."""
    path = resolve_path(cfg.source)
    found = subdirs(path)
    if len(found) == 2 and set(found) & set(IMAGE_DIRS) and set(found) & set(MASK_DIRS):
        raise ConfigError(f"data source {cfg.source!r} holds {found[0]}/ and {found[1]}/: a segmentation folder pair "
                          "(images and their label maps), not two classes; give it to `ropim segment`, or give a "
                          "folder whose sub-folders are classes (e.g. one holding a link to its images/)")
    if "train" in found and set(found) <= {"train", *VAL_NAMES} and imagefolder_splits(path) == {"all": path}:
        raise ConfigError(f"data source {cfg.source!r} holds {'/, '.join(found)}/ but {path}/train holds no class "
                          "folder (e.g. ImageNet's train/ still as .tar archives): these would be read as "
                          f"{len(found)} classes named after the splits; extract train/ into one folder per class")
    for folder in imagefolder_splits(path).values():
        if os.path.isdir(folder) and any(next(walk_images(os.path.join(folder, c), Listing(path, cfg.follow_links)),
                                              None) for c in subdirs(folder)):
            continue
        raise ConfigError(f"data source {cfg.source!r}: {no_images(folder, path)}")


def no_images(folder: str, root: str) -> str:
    """Why a split folder gives no image, and the fix: loose images, links out of the source, or none."""
    loose = [f for f in os.listdir(folder) if is_image(f)] if os.path.isdir(folder) else []
    if loose:
        return f"{len(loose)} images directly in {folder} but no class folders; {LAYOUT}"
    listing = Listing(root)
    for c in subdirs(folder) if os.path.isdir(folder) else []:
        list(walk_images(os.path.join(folder, c), listing))
    if listing.outside:
        return f"no image inside it: {listing.notes()[0]}"
    if listing.unlisted:
        return f"no image it can list: {listing.notes()[0]}"
    if listing.unread:
        return f"no image it reads: {listing.notes()[-1]}"
    return f"no images ({'/'.join(IMAGE_EXTENSIONS)}) in class folders under {folder}; {LAYOUT}"


def classes_of(dirs: dict[str, str]) -> list[str]:
    """The class names: every class folder of any split folder, sorted."""
    return sorted({c for d in dirs.values() if os.path.isdir(d) for c in subdirs(d)})


def source(cfg: DataConfig, img_size: int = 32) -> Source:
    """Every image file, labelled by its class folder (``img_size``: unused, transforms resize)."""
    root = resolve_path(cfg.source)
    dirs = imagefolder_splits(root)
    classes = classes_of(dirs)
    pools, listing = {}, Listing(root, cfg.follow_links)
    for split, d in dirs.items():
        paths, labels = [], []
        for label, c in enumerate(classes):
            folder = os.path.join(d, c)
            files = list(walk_images(folder, listing)) if os.path.isdir(folder) else []
            paths += [relative(f, root) for f in files]
            labels += [label] * len(files)
        pools[split] = FileList(root, labels, paths, classes)
    return Source(NAME, root, classes, cfg, pools, notes=listing.notes())


def train_head(cfg: DataConfig, k: int) -> FileList:
    """The first ``k`` images of the training split (fewer where it holds fewer), as ``source(cfg).split('train')``
    lists them: the same order, link rule and split rule (its own ``train/`` folder, else the hash of each path).
    The walk stops at the ``k``-th: a large tree is not listed for a sample."""
    root = resolve_path(cfg.source)
    dirs = imagefolder_splits(root)
    classes, listing, hashed = classes_of(dirs), Listing(root, cfg.follow_links), "all" in dirs
    top = dirs["all" if hashed else "train"]
    listed = ((relative(f, root), label) for label, c in enumerate(classes) if os.path.isdir(os.path.join(top, c))
              for f in walk_images(os.path.join(top, c), listing))
    train = (item for item in listed if not (hashed and in_val([item[0]], cfg.split_seed, cfg.val_fraction)[0]))
    head = list(islice(train, k))
    return FileList(root, [label for _, label in head], [path for path, _ in head], classes)
