"""Folder pairs, for segmentation: ``ROOT/images/`` + ``ROOT/masks/`` (or ``labels/``, ``annotations/``), files
matched by name stem, optionally with ``train/`` + ``val/`` below each (the split; else the seeded fraction); labels
0..K-1, 255 = ignore; K from ``ROOT/classes.json`` (a list of names) or ``data.num_classes``. ADE20K's release
layout is such a pair too (``ropim.data.formats.ade20k``). Every pair is listed: an image without a mask, or a mask
without an image, two files of one stem, or split folders on one side only, is refused before a job starts. Links
follow ImageFolder's rules: followed inside ROOT (each real image listed once), outside it only with
``data.follow_links`` (a pair with a link out is left out, and noted); a pair whose image is one listed already (a
link to it) is left out, and noted. A file of another type (a TIFF mask) is not listed: where it is an image's or a
mask's partner, the error names it. No torch, no Ray, no MLflow."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from ropim.data.formats.common import IMAGE_DIRS, MASK_DIRS, SEGMENT, Listing, Source, class_names, is_folder, is_image
from ropim.data.pair_lists import IGNORE, FileSegList
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


class PairListing(Listing):
    """A listing of folder pairs under the folder formats' link rule (``Listing``): images and masks matched by stem.
    ``repeats`` holds the pairs left out because their image was listed already: (image, its mask, the image kept)."""

    def __init__(self, root: str, follow: bool = False) -> None:
        super().__init__(root, follow)
        self.kept: dict[str, str] = {}  # an image's real path: the path it was listed under
        self.repeats: list[tuple[str, str | None, str]] = []

    def stems(self, folder: str, images: bool) -> tuple[dict[str, str], set[str]]:
        """({name stem: path} of the image files (any case of the extension) directly in ``folder``, the stems left
        out: links not followed and (``images``) images already listed under another name). ConfigError when two
        files share a stem. Only links are resolved (a plain file costs no stat call)."""
        found, left_out, real_folder = {}, set(), os.path.realpath(folder)
        if not self.allowed(folder, real_folder):
            return found, left_out
        with os.scandir(folder) as listing:
            files = [e for e in listing if not is_folder(e) and self.named(e.path)]
        if images:  # images of types not read (TIFF): said, as an image folder's (their masks follow them)
            for e in files:
                if not is_image(e.name):
                    self.passed_over(e.name)
        entries = sorted((e for e in files if is_image(e.name)), key=lambda e: e.name)
        for entry in entries:
            stem = os.path.splitext(entry.name)[0]
            if stem in found:
                raise ConfigError(f"{found[stem]} and {entry.path} have the same name stem {stem!r}: an image and "
                                  "its mask are matched by stem; rename or remove one of them")
            link = entry.is_symlink()
            real = os.path.realpath(entry.path) if link else os.path.join(real_folder, entry.name)
            if (link and not self.allowed(entry.path, real)) or (images and not self.first(real)):
                left_out.add(stem)
            elif images:
                self.kept[real] = entry.path
            found[stem] = entry.path
        return found, left_out

    def pairs(self, image_dir: str, mask_dir: str) -> tuple[list[str], list[str]]:
        """(images, masks) of the same stems; ConfigError naming the first image without a mask, or the reverse (and
        the file of that stem that is not listed, as a TIFF mask)."""
        (imgs, out_i), (masks, out_m) = self.stems(image_dir, True), self.stems(mask_dir, False)
        if imgs and not masks and not out_m:
            self.check_unread(mask_dir, set(imgs), imgs, "mask")
            raise ConfigError(f"no masks in {mask_dir} for the {len(imgs)} images of {image_dir}; put each image's "
                              "label map there as a PNG of the same name (class indices 0..K-1, 255 = ignore)")
        for a, b, missing, other in ((imgs, masks, "mask", mask_dir), (masks, imgs, "image", image_dir)):
            lonely = sorted(set(a) - set(b) - out_i - out_m)
            if lonely:
                self.check_unread(other, set(lonely), a, missing)
                raise ConfigError(f"{a[lonely[0]]} has no {missing} in {other} ({len(lonely)} such file(s)); every "
                                  "image needs a mask of the same name (.png) and every mask an image")
        self.repeats += [(imgs[k], masks.get(k), self.kept[os.path.realpath(imgs[k])]) for k in sorted(out_i)
                         if os.path.realpath(imgs[k]) in self.kept]
        keys = sorted(set(imgs) - out_i - out_m)
        if not keys:
            why = "".join(f"; {note}" for note in self.notes())
            raise ConfigError(f"data source: no images in {image_dir}{why}")
        return [imgs[k] for k in keys], [masks[k] for k in keys]

    def notes(self) -> list[str]:
        """``Listing.notes``, and the pairs left out because their image was listed already (none: [])."""
        if not self.repeats:
            return super().notes()
        image, mask, kept = (self.shown(f) if f else f for f in self.repeats[0])
        also = f" and its mask {mask}" if mask else ""
        return [*super().notes(), f"{len(self.repeats)} pair(s) left out: their image is one listed already (e.g. "
                f"{image} is {kept}, through a link); {kept}'s pair is kept, {image}{also} left out; copy the image "
                "to keep both pairs, or remove the link"]

    def check_unread(self, folder: str, stems: set[str], partners: dict[str, str], missing: str) -> None:
        """ConfigError naming the first file in ``folder`` of one of ``stems`` whose type is not listed (a TIFF
        mask), and its partner in ``partners`` ({stem: path}), which has no ``missing`` ('mask' or 'image'); nothing
        when none is."""
        names = sorted(n for n in os.listdir(folder) if os.path.splitext(n)[0] in stems and not n.startswith("."))
        for name in names:
            path = os.path.join(folder, name)
            if not is_image(name) and not os.path.isdir(path):
                stem, ext = os.path.splitext(name)
                fix = "a greyscale ('L') or palette ('P') PNG, one class index per pixel" if missing == "mask" \
                    else "PNG"
                raise ConfigError(f"{path} is not read, so {partners[stem]} has no {missing}: images and masks are "
                                  f"read only as {self.READ} files, not {ext}; save it as {fix}")


def split_dirs(image_dir: str, mask_dir: str) -> dict[str, tuple[str, str]]:
    """{split: (image folder, mask folder)}: 'train' and 'val' where both folders have them, else 'all'; ConfigError
    when only one side has them."""
    found = [{s: next((n for n in names if os.path.isdir(os.path.join(d, n))), None) for s, names in SPLIT_DIRS.items()}
             for d in (image_dir, mask_dir)]
    split = [all(f.values()) for f in found]
    if split[0] != split[1]:
        has, lacks = (image_dir, mask_dir) if split[0] else (mask_dir, image_dir)
        names = "/ + ".join(found[0 if split[0] else 1].values())
        raise ConfigError(f"{has} has split folders ({names}/) but {lacks} has not; give both the same split folders, "
                          "or put every file directly in images/ and masks/ (split by data.val_fraction)")
    if not split[0]:
        return {"all": (image_dir, mask_dir)}
    return {s: (os.path.join(image_dir, found[0][s]), os.path.join(mask_dir, found[1][s])) for s in SPLIT_DIRS}


def folder_classes(root: str, cfg: SegDataConfig, default: int | None) -> list[str]:
    """Class names from ROOT/classes.json, else ``data.num_classes`` or ``default`` numbered names (ADE20K's from 1:
    its stored labels)."""
    path = os.path.join(root, "classes.json")
    if os.path.isfile(path):
        with open(path) as f:
            names = class_names(json.load(f), path, cfg.num_classes)
        if len(names) > IGNORE:
            raise ConfigError(f"{path} names {len(names)} classes; at most {IGNORE} fit a mask (labels "
                              f"0..{IGNORE - 1}, {IGNORE} = ignore)")
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
    listing, pools = PairListing(root, cfg.follow_links), {}
    for split, dirs in split_dirs(image_dir, mask_dir).items():
        imgs, masks = (rel(root, files) for files in listing.pairs(*dirs))
        pools[split] = FileSegList(root, imgs, masks, len(classes), default_classes is not None)
    return Source(name, root, classes, cfg, pools, notes=listing.notes())


def rel(root: str, files: list[str]) -> list[str]:
    return [os.path.relpath(f, root).replace(os.sep, "/") for f in files]


def source(cfg: SegDataConfig, img_size: int = 32) -> Source:
    """The pairs of ROOT/images/ and ROOT/masks/ (``img_size``: unused, transforms resize)."""
    root = resolve_path(cfg.source)
    return folder_pairs(cfg, NAME, folder_of(root, IMAGE_DIRS, "images"), folder_of(root, MASK_DIRS, "masks"))
