"""What every source format shares: an opened source (``Source``), the seeded split rule and class names.
No torch, no Ray, no MLflow.

Splits: the source's own where it has one (ImageFolder ``train/`` + ``val/``, CIFAR train/test, ADE20K training/
validation, Parquet files named ``train-*`` / ``val-*``), else a seeded fraction: an item is in ``val`` when a hash
of (``split_seed``, its path relative to the source) falls below ``val_fraction``. Folders and their Parquet shards
use the same rule on the same relative path, so ``ropim data convert`` keeps every item in its split. (The built-in
digits keep their seeded permutation; a Parquet set without a ``path`` column hashes the image bytes.)
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ropim.data.lists import Items
from ropim.errors import ConfigError

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import DataConfig

CLASSIFY, SEGMENT = "classify", "segment"  # DataConfig.TASK, SegDataConfig.TASK
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
# image files of other types (TIFF from microscopes and satellites, …): not listed, and counted so a listing says so
OTHER_IMAGES = (".tif", ".tiff", ".jfif", ".jpe", ".jp2", ".ppm", ".pgm", ".pbm", ".dib", ".apng", ".heic", ".avif")
# the folders of a segmentation folder pair (``ropim.data.formats.pairs``; ADE20K's release: images/ + annotations/)
IMAGE_DIRS, MASK_DIRS = ("images", "imgs", "img"), ("masks", "labels", "annotations")
VAL_NAMES = ("val", "validation", "test")  # a folder or shard-name prefix that holds a source's own val split


def is_image(name: str) -> bool:
    """Whether a file name is an image's (by its extension; hidden files are not)."""
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def inside(path: str, root: str) -> bool:
    """Whether real path ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def is_folder(entry: os.DirEntry) -> bool:
    """Whether a folder entry is a folder, through a link (False when it cannot be told)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` with ``/`` separators (a prefix cut where it is one: ``relpath`` costs more than
    the listing)."""
    prefix = os.path.join(root, "")
    rel = path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)
    return rel.replace(os.sep, "/")


class Listing:
    """One listing of a folder source under the folder formats' link rule: links are followed inside ``root``, and
    outside it only with ``follow`` (``data.follow_links``); those not followed are kept in ``outside`` and named by
    ``notes``. Every real folder and file is met once (``first``), so a link cycle cannot multiply the images and a
    link cannot put one image in two classes or both splits."""

    def __init__(self, root: str, follow: bool = False) -> None:
        self.root, self.real_root, self.follow = root, os.path.realpath(root), follow
        self.seen: set[str] = set()
        self.outside: list[str] = []
        self.unread: dict[str, int] = {}  # image files of types not read (``OTHER_IMAGES``): {extension: count}
        self.linked: dict[str, str] = {}  # an image listed through a link: its real path -> the link
        self.again: list[tuple[str, str]] = []  # (path, real path) of images whose real file was listed already
        self.unlisted: list[tuple[str, OSError]] = []  # folders not listed (permissions, a stale mount), broken links
        self.misnamed: list[str] = []  # files and folders whose names are not UTF-8 (a path column cannot hold them)

    def allowed(self, path: str, real: str) -> bool:
        """Whether a folder or file (``real``: its real path) may be read: inside the source, or links are followed;
        ``outside`` gets it otherwise."""
        if self.follow or inside(real, self.real_root):
            return True
        self.outside.append(path)
        return False

    def first(self, real: str) -> bool:
        """Whether real path ``real`` is met for the first time in this listing (it is remembered)."""
        if real in self.seen:
            return False
        self.seen.add(real)
        return True

    def take(self, path: str, real: str, link: bool) -> bool:
        """Whether image ``path`` (``real``: its real path; ``link``: it is a symbolic link) is listed: its real file
        is met for the first time; ``again`` gets it otherwise (one picture is not listed twice). Only links are
        remembered by name (a tree of plain files costs no second map)."""
        if self.first(real):
            if link:
                self.linked[real] = path
            return True
        self.again.append((path, real))
        return False

    READ = "/".join(IMAGE_EXTENSIONS)  # the files a listing reads, as its messages name them

    def shown(self, path: str) -> str:
        """``path`` as the listing's messages show it: relative to the source."""
        return relative(path, self.root)

    def named(self, path: str) -> bool:
        """Whether ``path``'s name is valid UTF-8 (what paths are stored as, relative to the source); ``misnamed``
        gets it otherwise."""
        try:
            os.path.basename(path).encode("utf-8")
        except UnicodeEncodeError:  # bytes os.scandir could not decode, kept as surrogates
            self.misnamed.append(path)
            return False
        return True

    def passed_over(self, name: str) -> None:
        """Count a file that is not listed when it is an image of a type not read (``OTHER_IMAGES``)."""
        ext = os.path.splitext(name)[1].lower()
        if ext in OTHER_IMAGES and not name.startswith("."):
            self.unread[ext] = self.unread.get(ext, 0) + 1

    def notes(self) -> list[str]:
        """The links out of the source that were not followed, and how to follow them; the folders that could not be
        listed or named; the images reached twice; the image files of types not read, and the fix (none: [])."""
        notes = []
        if self.outside:
            first = self.outside[0]
            notes.append(f"{len(self.outside)} symbolic links lead outside the source (e.g. {self.shown(first)} -> "
                         f"{os.path.realpath(first)}) and are not followed; --data.follow_links true follows them "
                         "(`ropim data`: --follow-links true), each real file still listed once")
        if self.unlisted:
            path, err = self.unlisted[0]
            notes.append(f"{len(self.unlisted)} folder(s) or link(s) could not be read and their images are left out "
                         f"(e.g. {self.shown(path)}: {err.strerror or err}); make them readable to use them")
        if self.misnamed:
            shown = os.fsencode(self.shown(self.misnamed[0])).decode("utf-8", "backslashreplace")
            notes.append(f"{len(self.misnamed)} file(s) or folder(s) whose names are not valid UTF-8 are left out "
                         f"(e.g. {shown}); rename them to use them")
        if self.again:
            path, real = self.again[0]
            notes.append(f"{len(self.again)} image(s) listed once though reached twice (e.g. {self.shown(path)} is "
                         f"{self.shown(self.linked.get(real, real))}, through a link): the first met is kept, so that "
                         "a picture is in one class and one split; copy the image to keep both")
        if self.unread:
            kinds = ", ".join(f"{n} {ext}" for ext, n in sorted(self.unread.items()))
            notes.append(f"{sum(self.unread.values())} image files of types not read are left out ({kinds}): images "
                         f"are read as {self.READ} files; save them as PNG to use them")
        return notes


def in_val(keys, seed: int, fraction: float) -> np.ndarray:
    """Boolean mask: which keys (paths as str, or image bytes) fall in the val fraction for ``seed``."""
    prefix = f"ropim-split/{seed}/".encode()
    out = np.empty(len(keys), dtype=bool)
    for i, k in enumerate(keys):
        h = hashlib.blake2b(prefix + (k.encode() if isinstance(k, str) else bytes(k)), digest_size=8).digest()
        out[i] = int.from_bytes(h, "big") < fraction * 2**64
    return out


def split_indices(n: int, val_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """A seeded random train/val partition of range(n) (the built-in digits' split)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(n * val_fraction))
    return {"val": np.sort(perm[:n_val]), "train": np.sort(perm[n_val:])}


def class_names(names: object, where: str, num_classes: int | None = None) -> list[str]:
    """A list of class names as strings, as many as ``num_classes`` (``data.num_classes``) when given; ConfigError
    naming ``where`` otherwise."""
    if not isinstance(names, list) or not names or not all(isinstance(n, (str, int)) for n in names):
        raise ConfigError(f"class names in {where} must be a non-empty JSON list of strings, got {str(names)[:80]}")
    if num_classes is not None and num_classes != len(names):
        raise ConfigError(f"data.num_classes={num_classes} but {where} names {len(names)} classes; leave "
                          "data.num_classes unset (the source names its classes) or make them agree")
    return [str(n) for n in names]


@dataclass
class Source:
    """An opened source: its format, location, class names and items, listed (nothing decoded). ``pools`` holds
    'train' and 'val' where the source has a split of its own, else 'all', which ``split`` divides by the seeded
    fraction of ``cfg``."""

    format: str
    location: str
    classes: list[str]
    cfg: DataConfig
    pools: dict[str, Items] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list, kw_only=True)  # what a listing left out (``ropim data inspect``)

    @property
    def own_split(self) -> bool:
        """Whether the split is the source's own (else the seeded fraction)."""
        return "all" not in self.pools

    def split(self, name: str | None, cache_files: int | None = None) -> Items:
        """The items of split ``name`` ('train' / 'val'), or of the whole source (None); ConfigError if none.
        ``cache_files``: how many Parquet files' images a list keeps read (None: a few, as a training order reads
        them: ``ropim.data.sampling``)."""
        items = self.listed(name, cache_files)
        if len(items) == 0:
            what = f"split {name!r}" if name else "the data set"
            noun = "pairs" if self.cfg.TASK == SEGMENT else "images"
            fix = f"raise data.val_fraction or add more {noun}" if name == "val" and not self.own_split else \
                f"add {noun}"
            also = f" ({'; '.join(self.notes)})" if self.notes else ""
            raise ConfigError(f"data source {self.cfg.source!r}: {what} is empty{also}; {fix}")
        return items

    def listed(self, name: str | None, cache_files: int | None) -> Items:
        """``split``'s items, maybe none."""
        if name is None:
            first, *rest = self.pools.values()
            return first.concat(*rest) if rest else first
        if self.own_split:
            return self.pools[name]
        pool = self.pools["all"]
        return pool.subset(np.flatnonzero(self.in_val(pool) == (name == "val")))

    def in_val(self, pool: Items) -> np.ndarray:
        """Which items of a source without a split of its own fall in val (the hash of their paths)."""
        return in_val(pool.paths, self.cfg.split_seed, self.cfg.val_fraction)
