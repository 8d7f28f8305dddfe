"""Opening a source: what each split holds (file names, labels, paths, classes; no image decoding).

Splits: the source's own where it has one (ImageFolder ``train/`` + ``val/``, CIFAR train/test, Parquet files
named ``train-*`` / ``val-*``), else a seeded fraction: an image is in ``val`` when a hash of
(``split_seed``, its path) falls below ``val_fraction``. ImageFolder and Parquet use the same rule on the same
relative path, so ``ropim data convert`` keeps every image in its split. (Built-in digits keep their seeded
permutation; a Parquet set without a ``path`` column hashes the image bytes.) Parquet class names: schema
metadata ``classes`` (JSON list), else ``classes.json`` beside the shards, else ``"0"…"K-1"``.

No torch, no Ray, no MLflow.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass, field

import numpy as np
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ropim.data import footers
from ropim.data.config import DataConfig
from ropim.data.decode import none_decode, undecodable
from ropim.data.layout import (
    PARQUET_ERRORS,
    check_source,
    cifar_root,
    detect_format,
    imagefolder_splits,
    parquet_files,
    parquet_split_of,
    subdirs,
    unreadable_parquet,
    walk_images,
)
from ropim.data.lists import (
    ArrayList,
    FileList,
    ImageList,
    ParquetList,
    digits_count,
    load_digits,
    read_cifar,
    split_indices,
)
from ropim.errors import ConfigError

PREFLIGHT_SAMPLE = 8  # the first images of a training split that pre-flight decodes


def in_val(keys, seed: int, fraction: float) -> np.ndarray:
    """Boolean mask: which keys (paths as str, or image bytes) fall in the val fraction for ``seed``."""
    prefix = f"ropim-split/{seed}/".encode()
    out = np.empty(len(keys), dtype=bool)
    for i, k in enumerate(keys):
        h = hashlib.blake2b(prefix + (k.encode() if isinstance(k, str) else bytes(k)), digest_size=8).digest()
        out[i] = int.from_bytes(h, "big") < fraction * 2**64
    return out


# ----------------------------------------------------------------------------------------------- locations


def class_names(names: object, where: str) -> list[str]:
    """A list of class names as strings; ConfigError naming ``where`` otherwise."""
    if not isinstance(names, list) or not names or not all(isinstance(n, (str, int)) for n in names):
        raise ConfigError(f"class names in {where} must be a non-empty JSON list of strings, got {str(names)[:80]}")
    return [str(n) for n in names]


def _parquet_classes(fs, files: list[str]) -> list[str]:
    """Class names from the schema metadata, a classes.json beside the shards, or "0".."K-1" from the labels."""
    meta = footers.schema(fs, files[0]).metadata or {}
    if b"classes" in meta:
        return class_names(json.loads(meta[b"classes"]), f"{files[0]}'s schema metadata")
    for folder in dict.fromkeys(posixpath.dirname(f) for f in files[:1] + files[-1:]):
        for d in (folder, posixpath.dirname(folder)):
            p = posixpath.join(d, "classes.json")
            if fs.get_file_info(p).type == pafs.FileType.File:
                with fs.open_input_stream(p) as f:
                    return class_names(json.loads(f.read()), p)
    max_label = max((pc.max(footers.read_columns(fs, f, ["label"])["label"]).as_py() or 0)
                    for f in files)
    return [str(i) for i in range(max_label + 1)]


@dataclass
class Source:
    """An opened source: its format, classes, and whether the splits are its own."""

    format: str
    location: str
    classes: list[str]
    own_split: bool
    pools: dict[str, ImageList] = field(default_factory=dict)  # 'train'/'val', or 'all' (no own split)
    fs: pafs.FileSystem | None = None
    files: dict[str, list[str]] = field(default_factory=dict)  # parquet: 'train'/'val'/'all' → files


def open_source(cfg: DataConfig, img_size: int = 32) -> Source:
    """List the source (file names, labels, paths; no image decoding). ConfigError if it holds no images."""
    fmt = check_source(cfg.source, cfg.format)
    location = cfg.source
    if fmt == "digits":
        images, labels, classes = load_digits(img_size)
        paths = [f"digits/{i:04d}.png" for i in range(len(labels))]
        return Source(fmt, location, classes, False, {"all": ArrayList(images, labels, paths, classes)})
    if fmt == "cifar":
        folder, kind = cifar_root(os.path.abspath(os.path.expanduser(location)))
        pools, classes = read_cifar(folder, kind)
        return Source(fmt, folder, classes, True, pools)
    if fmt == "imagefolder":
        root = os.path.abspath(os.path.expanduser(location))
        dirs = imagefolder_splits(root)
        classes = sorted({c for d in dirs.values() if os.path.isdir(d) for c in subdirs(d)})
        pools = {}
        for split, d in dirs.items():
            paths, labels = [], []
            for label, c in enumerate(classes):
                files = walk_images(os.path.join(d, c), root=root) if os.path.isdir(os.path.join(d, c)) else []
                paths += [os.path.relpath(f, root).replace(os.sep, "/") for f in files]
                labels += [label] * len(files)
            pools[split] = FileList(root, labels, paths, classes)
        return Source(fmt, root, classes, "all" not in pools, pools)
    fs, files = parquet_files(location)
    by_split = {"train": [], "val": []}
    for f in files:
        by_split["val" if parquet_split_of(f) == "val" else "train"].append(f)
    own = bool(by_split["val"]) and bool(by_split["train"])
    groups = by_split if own else {"all": files}
    return Source(fmt, location, _parquet_classes(fs, files), own, {}, fs, groups)


def _parquet_list(src: Source, files: list[str], keep_val: bool | None, cfg: DataConfig,
                  cache_files: int | None) -> ParquetList:
    """Rows of ``files`` (all, or the val/train side of the seeded fraction) as a ParquetList."""
    rows, labels, paths = [], [], []
    for f in files:
        try:
            names = footers.schema(src.fs, f).names
            t = footers.read_columns(src.fs, f, ["label"] + (["path"] if "path" in names else []))
        except PARQUET_ERRORS as err:
            raise unreadable_parquet(cfg.source, f, err) from None
        lab = t["label"].to_numpy(zero_copy_only=False).astype(np.int64)
        if len(lab) and (lab.min() < 0 or lab.max() >= len(src.classes)):
            raise ConfigError(f"data source {cfg.source!r}: {f} has labels {lab.min()}..{lab.max()}, outside the "
                              f"{len(src.classes)} classes ({', '.join(src.classes[:5])}…); fix the labels or the "
                              "class names")
        pth = t["path"].to_pylist() if "path" in names else [None] * len(lab)
        idx = np.arange(len(lab))
        if keep_val is not None:
            keys = list(pth)
            if any(k is None for k in keys):  # no path: hash the image bytes
                img = footers.read_columns(src.fs, f, ["image"])["image"].to_pylist()
                keys = [k if k is not None else b for k, b in zip(keys, img, strict=True)]
            idx = idx[in_val(keys, cfg.split_seed, cfg.val_fraction) == keep_val]
        rows.append(idx)
        labels.append(lab[idx])
        paths += [pth[i] if pth[i] is not None else f"{f}#{i}" for i in idx]
    labels = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    return ParquetList(src.fs, files, rows, labels, paths, src.classes, cache_files)


def _subset(pool: ImageList, idx: np.ndarray) -> ImageList:
    labels, paths = pool.labels[idx], [pool.paths[i] for i in idx]
    if isinstance(pool, ArrayList):
        return ArrayList(pool.images[idx], labels, paths, pool.classes)
    return FileList(pool.root, labels, paths, pool.classes)


def split_list(src: Source, cfg: DataConfig, split: str | None, cache_files: int | None = None) -> ImageList:
    """The images of ``split`` ('train' / 'val'), or of the whole source (None). ConfigError if empty."""
    if src.format == "parquet":
        if split is None:
            files = [f for fs in src.files.values() for f in fs]
            lst = _parquet_list(src, files, None, cfg, cache_files)
        elif src.own_split:
            lst = _parquet_list(src, src.files[split], None, cfg, cache_files)
        else:
            lst = _parquet_list(src, src.files["all"], split == "val", cfg, cache_files)
    elif split is None:
        pools = list(src.pools.values())
        lst = pools[0] if len(pools) == 1 else _concat(pools)
    elif src.own_split:
        lst = src.pools[split]
    else:
        pool = src.pools["all"]
        if src.format == "digits":
            idx = split_indices(len(pool), cfg.val_fraction, cfg.split_seed)[split]
        else:
            idx = np.flatnonzero(in_val(pool.paths, cfg.split_seed, cfg.val_fraction) == (split == "val"))
        lst = _subset(pool, idx)
    if len(lst) == 0:
        what = f"split {split!r}" if split else "the data set"
        fix = "raise data.val_fraction or add more images" if split == "val" and not src.own_split else \
            "add images"
        raise ConfigError(f"data source {cfg.source!r}: {what} is empty; {fix}")
    return lst


def count_images(cfg: DataConfig, split: str) -> int:
    """Images in ``split`` without decoding any (bad files included; they are found when decoded)."""
    if detect_format(cfg.source, cfg.format) == "digits":  # the seeded split of the labels: no torch
        return len(split_indices(digits_count(), cfg.val_fraction, cfg.split_seed)[split])
    return len(split_list(open_source(cfg), cfg, split))


def check_batch_fits(cfg: DataConfig, batches: dict[str, int]) -> int:
    """The training split's image count, listed once; ConfigError naming the flag when it holds less than one of
    the ``batches`` ({flag: batch size}), or naming the source when none of its first images decodes
    (``check_decodes``)."""
    images = None if detect_format(cfg.source, cfg.format) == "digits" else split_list(open_source(cfg), cfg, "train")
    n = count_images(cfg, "train") if images is None else len(images)
    for name, batch_size in batches.items():
        if n < batch_size:
            raise ConfigError(f"{name}={batch_size} exceeds the training split ({n} images)")
    if images is not None:
        check_decodes(cfg, images)
    return n


def check_decodes(cfg: DataConfig, images: ImageList | None = None) -> None:
    """ConfigError naming the source when none of the first ``PREFLIGHT_SAMPLE`` images of ``images`` (default: the
    training split; the built-in digits are not read) decodes: pre-flight's guard against a source that would give
    the job no image at all (one row group of a Parquet shard is read, in a fraction of a second)."""
    if images is None:
        if detect_format(cfg.source, cfg.format) == "digits":
            return
        images = split_list(open_source(cfg), cfg, "train")
    sample = images.head(PREFLIGHT_SAMPLE)
    bad = undecodable(sample, cfg.max_pixels)
    if sample and len(bad) == len(sample):
        raise none_decode(cfg.source, f"the first {len(sample)} images of the training split", bad)


def _concat(pools: list[ImageList]) -> ImageList:
    labels = np.concatenate([p.labels for p in pools])
    paths = [p for pool in pools for p in pool.paths]
    if isinstance(pools[0], ArrayList):
        return ArrayList(np.concatenate([p.images for p in pools]), labels, paths, pools[0].classes)
    return FileList(pools[0].root, labels, paths, pools[0].classes)

