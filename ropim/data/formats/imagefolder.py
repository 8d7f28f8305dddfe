"""ImageFolder trees, for classification: ``ROOT/<class>/<image>`` (any depth below the class folder), or
``ROOT/train/<class>/…`` and ``ROOT/val/<class>/…`` (its own split). JPEG/PNG/WebP/BMP/GIF; greyscale, RGBA and
palette images become RGB. No torch, no Ray, no MLflow."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ropim.data.formats.common import (
    CLASSIFY,
    IMAGE_DIRS,
    IMAGE_EXTENSIONS,
    MASK_DIRS,
    VAL_NAMES,
    Source,
    inside,
    is_folder,
    is_image,
    links_note,
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


def walk_images(folder: str, first_only: bool = False, root: str | None = None, seen: set[str] | None = None,
                outside: list[str] | None = None, follow: bool = False) -> list[str]:
    """Image files below ``folder`` (sorted, recursive, a folder's files before its sub-folders'); stop at the first
    if asked. Symbolic links are followed to folders and files inside ``root`` (default: ``folder``), and outside it
    only with ``follow`` (the links not followed are added to ``outside``). Every real folder and file is listed once:
    once in ``seen`` (shared by the walks of one source), it is not listed again, so a link cycle cannot multiply the
    images and a link cannot put one image in two classes or both splits. One ``scandir`` per folder: only links are
    resolved (``realpath``), so a file costs no stat call (resolving every file's path stat-ed each of its parent
    folders: 3.9 s for 200k files, 0.6 s without)."""
    root_real, seen, out = os.path.realpath(root or folder), set() if seen is None else seen, []
    stack = [(folder, os.path.realpath(folder))]
    while stack:
        dirpath, real = stack.pop()
        if not (follow or inside(real, root_real)):
            if outside is not None:
                outside.append(dirpath)
            continue
        if real in seen:
            continue
        seen.add(real)
        try:
            with os.scandir(dirpath) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:  # an unreadable folder holds no image we can read
            continue
        subfolders = []
        for entry in entries:
            target = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(real, entry.name)
            if is_folder(entry):
                if not entry.name.startswith("."):
                    subfolders.append((entry.path, target))
            elif is_image(entry.name) and not (follow or inside(target, root_real)):
                if outside is not None:
                    outside.append(entry.path)
            elif is_image(entry.name) and target not in seen:
                seen.add(target)
                out.append(entry.path)
                if first_only:
                    return out
        stack += reversed(subfolders)
    return out


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
    for folder in imagefolder_splits(path).values():
        if os.path.isdir(folder) and any(walk_images(os.path.join(folder, c), True, path, follow=cfg.follow_links)
                                         for c in subdirs(folder)):
            continue
        raise ConfigError(f"data source {cfg.source!r}: {no_images(folder, path)}")


def no_images(folder: str, root: str) -> str:
    """Why a split folder gives no image, and the fix: loose images, links out of the source, or none."""
    loose = [f for f in os.listdir(folder) if is_image(f)] if os.path.isdir(folder) else []
    if loose:
        return f"{len(loose)} images directly in {folder} but no class folders; {LAYOUT}"
    outside = []
    for c in subdirs(folder) if os.path.isdir(folder) else []:
        walk_images(os.path.join(folder, c), root=root, outside=outside)
    if outside:
        return f"no image inside it: {links_note(outside, root)}"
    return f"no images ({'/'.join(IMAGE_EXTENSIONS)}) in class folders under {folder}; {LAYOUT}"


def source(cfg: DataConfig, img_size: int = 32) -> Source:
    """Every image file, labelled by its class folder (``img_size``: unused, transforms resize)."""
    root = resolve_path(cfg.source)
    dirs = imagefolder_splits(root)
    classes = sorted({c for d in dirs.values() if os.path.isdir(d) for c in subdirs(d)})
    pools, seen, outside = {}, set(), []
    for split, d in dirs.items():
        paths, labels = [], []
        for label, c in enumerate(classes):
            folder = os.path.join(d, c)
            files = (walk_images(folder, root=root, seen=seen, outside=outside, follow=cfg.follow_links)
                     if os.path.isdir(folder) else [])
            paths += [relative(f, root) for f in files]
            labels += [label] * len(files)
        pools[split] = FileList(root, labels, paths, classes)
    notes = [links_note(outside, root)] if outside else []
    return Source(NAME, root, classes, cfg, pools, notes=notes)
