"""Image sources: detect the layout at a path, list what each split holds, read and decode images.

Formats (``DataConfig.format``; ``auto`` detects them in this order):

* ``digits``      scikit-learn's built-in 8×8 digits (``source="digits"``), upscaled, RGB.
* ``parquet``     shards with an encoded ``image`` column, an int ``label`` column and optionally ``path``:
                  a folder (searched recursively), a glob, one file, or any URI pyarrow's filesystems read
                  (``s3://…``, ``gs://…``, ``hdfs://…``). Class names: schema metadata ``classes`` (JSON list),
                  else ``classes.json`` beside the shards, else ``"0"…"K-1"``.
* ``cifar``       CIFAR-10/100 python pickles (``cifar-10-batches-py/``, ``cifar-100-python/``, or their parent).
* ``imagefolder`` ``ROOT/<class>/<image>`` (any depth below the class folder), or ``ROOT/train/<class>/…`` and
                  ``ROOT/val/<class>/…``. JPEG/PNG/WebP/BMP; greyscale, RGBA and palette images become RGB.

Splits: the source's own where it has one (ImageFolder ``train/`` + ``val/``, CIFAR train/test, Parquet files
named ``train-*`` / ``val-*``), else a seeded fraction: an image is in ``val`` when a hash of
(``split_seed``, its path) falls below ``val_fraction``. ImageFolder and Parquet use the same rule on the same
relative path, so ``ropim data convert`` keeps every image in its split. (Built-in digits keep their seeded
permutation; a Parquet set without a ``path`` column hashes the image bytes.)

No torch, no Ray, no MLflow.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import pickle
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from PIL import Image

from ropim.errors import ConfigError

if TYPE_CHECKING:
    from ropim.data import DataConfig

log = logging.getLogger("ropim.data")

FORMATS = ("digits", "parquet", "cifar", "imagefolder")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
VAL_NAMES = ("val", "validation", "test")
MAX_LOGGED_BAD = 20
HINT = ("give 'digits', an ImageFolder tree (ROOT/<class>/<image>), a CIFAR python folder "
        "(cifar-10-batches-py/), or Parquet shards (a folder, glob or s3:// URI)")


class BadImageError(ConfigError):
    """An image that cannot be decoded, under ``on_bad_image="fail"``; the message names it."""


class BadImages:
    """The bad-image policy in one process: ``skip`` counts and logs (first 20 paths), ``fail`` raises."""

    def __init__(self, policy: str = "skip") -> None:
        self.policy, self.count, self.paths = policy, 0, []

    def add(self, path: str, err: BaseException | str) -> None:
        if self.policy == "fail":
            raise BadImageError(f"{path}: cannot decode image ({err}); remove or replace the file, "
                                f"or set data.on_bad_image=skip to skip such files")
        self.count += 1
        if len(self.paths) < MAX_LOGGED_BAD:
            self.paths.append(path)
            more = "; further bad images are counted, not logged" if len(self.paths) == MAX_LOGGED_BAD else ""
            log.warning(f"skipping undecodable image {path} ({err}){more}")


def decode_rgb(data: bytes | np.ndarray) -> Image.Image:
    """An RGB image from encoded bytes (greyscale/RGBA/palette converted) or an (H, W, 3) uint8 array.

    Raises on undecodable or truncated data (PIL's errors); callers apply the bad-image policy.
    """
    if isinstance(data, np.ndarray):
        return Image.fromarray(data)
    with Image.open(io.BytesIO(data)) as img:
        img.load()  # decodes everything: truncated files raise here
        if img.mode == "P" and "transparency" in img.info:
            return img.convert("RGBA").convert("RGB")
        return img.convert("RGB")


def try_decode(data: bytes | np.ndarray | None, path: str, bad: BadImages) -> Image.Image | None:
    """``decode_rgb`` under the policy: None (counted, logged) for a bad image when skipping."""
    try:
        if data is None:
            raise OSError("unreadable file")
        return decode_rgb(data)
    except Exception as err:  # noqa: BLE001 — any decoder failure makes the image bad
        bad.add(path, err)
        return None


def in_val(keys, seed: int, fraction: float) -> np.ndarray:
    """Boolean mask: which keys (paths as str, or image bytes) fall in the val fraction for ``seed``."""
    prefix = f"ropim-split/{seed}/".encode()
    out = np.empty(len(keys), dtype=bool)
    for i, k in enumerate(keys):
        h = hashlib.blake2b(prefix + (k.encode() if isinstance(k, str) else bytes(k)), digest_size=8).digest()
        out[i] = int.from_bytes(h, "big") < fraction * 2**64
    return out


# ----------------------------------------------------------------------------------------------- locations


def is_uri(location: str) -> bool:
    return "://" in location


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or a URI such as ``s3://bucket/prefix``."""
    if is_uri(location):
        try:
            return pafs.FileSystem.from_uri(location)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
            raise ConfigError(f"data source {location!r}: cannot open this URI ({err}); {HINT}") from None
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(location))


def _hidden(relpath: str) -> bool:
    return any(part.startswith((".", "_")) for part in relpath.split("/"))


def parquet_files(location: str) -> tuple[pafs.FileSystem, list[str]]:
    """The Parquet shards at a folder (recursive), glob or file; hidden/temporary files are ignored."""
    glob = any(c in location for c in "*?[")
    fs, path = filesystem(location)
    if glob:
        base = path[: min(path.find(c) for c in "*?[" if c in path)].rpartition("/")[0] or "/"
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, path)]
    else:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise ConfigError(f"data source {location!r}: no such file or folder; {HINT}")
        if info.type == pafs.FileType.File:
            return fs, [path]
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")
                 and not _hidden(posixpath.relpath(i.path, path))]
    if not files:
        raise ConfigError(f"data source {location!r}: no Parquet files found; {HINT}")
    return fs, sorted(files)


def parquet_split_of(file: str) -> str | None:
    """'train' / 'val' from a shard's name (``train-00000.parquet``) or folder (``val/part-0.parquet``)."""
    parent, name = posixpath.split(file)
    for word in (name.split(".")[0].replace("_", "-").split("-")[0], posixpath.basename(parent)):
        if word == "train":
            return "train"
        if word in VAL_NAMES:
            return "val"
    return None


def _cifar_root(path: str) -> tuple[str, str] | None:
    """(folder, 'cifar10' | 'cifar100') when ``path`` is, or directly holds, a CIFAR python folder."""
    for d in (path, os.path.join(path, "cifar-10-batches-py"), os.path.join(path, "cifar-100-python")):
        if os.path.isfile(os.path.join(d, "batches.meta")) and os.path.isfile(os.path.join(d, "test_batch")):
            return d, "cifar10"
        if all(os.path.isfile(os.path.join(d, f)) for f in ("meta", "train", "test")):
            return d, "cifar100"
    return None


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def _walk_images(folder: str, first_only: bool = False) -> list[str]:
    """Image files below ``folder`` (sorted, recursive, following links); stop at the first if asked."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if _is_image(f):
                out.append(os.path.join(dirpath, f))
                if first_only:
                    return out
    return out


def _subdirs(folder: str) -> list[str]:
    return sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))


def _imagefolder_splits(root: str) -> dict[str, str]:
    """{'train': dir, 'val': dir} for ROOT/train + ROOT/val layouts, else {'all': ROOT (or ROOT/train)}."""
    train = os.path.join(root, "train")
    val = next((os.path.join(root, v) for v in VAL_NAMES if os.path.isdir(os.path.join(root, v))), None)
    if os.path.isdir(train) and _subdirs(train):
        return {"train": train, "val": val} if val else {"all": train}
    return {"all": root}


def _holds_parquet(folder: str) -> bool:
    """Parquet files directly in ``folder`` or one level down (train/, val/); no deep walk."""
    for d in [folder] + [os.path.join(folder, s) for s in _subdirs(folder)]:
        if any(f.endswith(".parquet") and not f.startswith((".", "_")) for f in os.listdir(d)):
            return True
    return False


def detect_format(cfg: DataConfig) -> str:
    """The source's format (``cfg.format`` checked, or detected); ConfigError naming the path otherwise."""
    location, forced = cfg.source, cfg.format
    if location == "digits" and forced in ("auto", "digits"):
        return "digits"
    if forced == "digits":
        raise ConfigError(f"data source {location!r} with format=digits: use source=digits")
    remote_or_glob = is_uri(location) or any(c in location for c in "*?[")
    if remote_or_glob or forced == "parquet":
        if forced not in ("auto", "parquet"):
            raise ConfigError(f"data source {location!r}: format={forced} reads local folders only; "
                              f"use format=parquet, or copy the data locally")
        return "parquet"
    path = os.path.abspath(os.path.expanduser(location))
    if not os.path.exists(path):
        raise ConfigError(f"data source {location!r}: no such file or folder; {HINT}")
    if forced == "cifar" or (forced == "auto" and _cifar_root(path)):
        if not _cifar_root(path):
            raise ConfigError(f"data source {location!r}: not a CIFAR python folder (expected batches.meta + "
                              f"data_batch_* + test_batch, or meta + train + test)")
        return "cifar"
    if os.path.isfile(path):
        if forced == "auto" and path.endswith(".parquet"):
            return "parquet"
        raise ConfigError(f"data source {location!r} is a file but not a Parquet shard; {HINT}")
    if forced == "auto" and _holds_parquet(path):
        return "parquet"
    return "imagefolder"


def check_source(cfg: DataConfig) -> str:
    """Cheap pre-flight check that the source exists and holds images; returns its format.

    Raises one ConfigError naming the path and the fix (missing path, no images, empty shards, missing
    columns). Stops at the first image found, so it is fast on large trees. ``DataConfig.validate()``
    calls it, so ``PretrainConfig.validate()`` runs it before Ray starts.
    """
    fmt = detect_format(cfg)
    location = cfg.source
    if fmt == "parquet":
        fs, files = parquet_files(location)
        schema = pq.read_schema(files[0], filesystem=fs)
        missing = [c for c in ("image", "label") if c not in schema.names]
        if missing:
            raise ConfigError(f"data source {location!r}: {files[0]} has no {' / '.join(missing)} column "
                              f"(columns: {', '.join(schema.names)}); write shards with `ropim data convert`")
        if not any(pq.read_metadata(f, filesystem=fs).num_rows for f in files):
            raise ConfigError(f"data source {location!r}: {len(files)} Parquet file(s) but no rows; "
                              f"the data set is empty")
    elif fmt == "imagefolder":
        path = os.path.abspath(os.path.expanduser(location))
        for folder in _imagefolder_splits(path).values():
            if os.path.isdir(folder) and any(_walk_images(os.path.join(folder, c), True) for c in _subdirs(folder)):
                continue
            loose = [f for f in os.listdir(folder) if _is_image(f)] if os.path.isdir(folder) else []
            where = f"{len(loose)} images directly in {folder} but no class folders" if loose else \
                f"no images ({'/'.join(IMAGE_EXTENSIONS)}) in class folders under {folder}"
            raise ConfigError(f"data source {location!r}: {where}; an ImageFolder needs ROOT/<class>/<image> "
                              f"(or ROOT/train/<class>/… and ROOT/val/<class>/…)")
    return fmt


# ------------------------------------------------------------------------------------------------- lists


class ImageList:
    """Random access to a split's images: ``labels`` (int64), ``paths``, ``classes``; ``load(i)`` → data.

    ``load`` returns encoded bytes or an (H, W, 3) uint8 array (``decode_rgb`` takes both), or raises
    OSError when the file cannot be read.
    """

    kind = "encoded"  # "encoded" (bytes), "file" (local files) or "array"

    def __init__(self, labels: np.ndarray, paths: list[str], classes: list[str]) -> None:
        self.labels, self.paths, self.classes = np.asarray(labels, dtype=np.int64), list(paths), classes

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, i: int) -> bytes | np.ndarray:
        raise NotImplementedError


class ArrayList(ImageList):
    """Images held as a uint8 (N, H, W, 3) array (digits, CIFAR)."""

    kind = "array"

    def __init__(self, images: np.ndarray, labels, paths, classes) -> None:
        super().__init__(labels, paths, classes)
        self.images = images

    def load(self, i: int) -> np.ndarray:
        return self.images[i]


class FileList(ImageList):
    """Image files under ``root``; ``paths`` are relative to it."""

    kind = "file"

    def __init__(self, root: str, labels, paths, classes) -> None:
        super().__init__(labels, paths, classes)
        self.root = root

    def file(self, i: int) -> str:
        return os.path.join(self.root, self.paths[i])

    def load(self, i: int) -> bytes:
        with open(self.file(i), "rb") as f:
            return f.read()


class ParquetList(ImageList):
    """Selected rows of Parquet shards. Image bytes are read per file on first use and cached
    (``cache_files`` files at a time; None keeps every file, for random access while training)."""

    def __init__(self, fs, files: list[str], rows: list[np.ndarray], labels, paths, classes,
                 cache_files: int | None = None) -> None:
        super().__init__(labels, paths, classes)
        self.fs, self.files, self.rows, self.cache_files = fs, files, rows, cache_files
        self.offsets = np.cumsum([0] + [len(r) for r in rows])
        self._cache: dict[int, pa.ChunkedArray] = {}

    def load(self, i: int) -> bytes:
        f = int(np.searchsorted(self.offsets, i, side="right")) - 1
        if f not in self._cache:
            if self.cache_files is not None and len(self._cache) >= self.cache_files:
                self._cache.pop(next(iter(self._cache)))
            col = pq.read_table(self.files[f], columns=["image"], filesystem=self.fs)["image"]
            self._cache[f] = col.take(pa.array(self.rows[f]))
        return self._cache[f][i - int(self.offsets[f])].as_py()

    def __getstate__(self):  # workers (DataLoader, Ray) read their own copy
        return {**self.__dict__, "_cache": {}}


def load_digits(size: int = 32) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """scikit-learn digits as uint8 (1797, size, size, 3) images, int64 labels, class names."""
    import torch
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = torch.from_numpy(bunch.images).float().unsqueeze(1) * (255.0 / 16.0)  # (N, 1, 8, 8) in [0, 255]
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.round().clamp(0, 255).to(torch.uint8).expand(-1, 3, -1, -1)  # (N, 3, size, size)
    return x.permute(0, 2, 3, 1).contiguous().numpy(), bunch.target.astype(np.int64), [str(d) for d in range(10)]


def split_indices(n: int, val_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """A seeded random train/val partition of range(n) (the built-in digits' split)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(n * val_fraction))
    return {"val": np.sort(perm[:n_val]), "train": np.sort(perm[n_val:])}


class _CifarUnpickler(pickle.Unpickler):
    """Loads CIFAR's pickles (dicts, lists, numpy arrays) and refuses anything else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"CIFAR file refers to {module}.{name}; not a CIFAR batch")
        return super().find_class(module, name)


def _unpickle(path: str) -> dict:
    with open(path, "rb") as f:
        d = _CifarUnpickler(f, encoding="bytes").load()
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}


def _cifar(folder: str, kind: str) -> tuple[dict[str, ArrayList], list[str]]:
    if kind == "cifar10":
        meta, label_key, names_key = "batches.meta", "labels", "label_names"
        files = {"train": sorted(f for f in os.listdir(folder) if f.startswith("data_batch_")), "val": ["test_batch"]}
    else:
        meta, label_key, names_key = "meta", "fine_labels", "fine_label_names"
        files = {"train": ["train"], "val": ["test"]}
    classes = [n.decode() if isinstance(n, bytes) else n for n in _unpickle(os.path.join(folder, meta))[names_key]]
    out = {}
    for split, names in files.items():
        images, labels, paths = [], [], []
        for name in names:
            d = _unpickle(os.path.join(folder, name))
            data = np.asarray(d["data"], dtype=np.uint8)
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels += list(d[label_key])
            fnames = d.get("filenames") or [f"{name}_{i:05d}.png".encode() for i in range(len(data))]
            paths += [f"{split}/{(f.decode() if isinstance(f, bytes) else f)}" for f in fnames]
        out[split] = ArrayList(np.ascontiguousarray(np.concatenate(images)), labels, paths, classes)
    return out, classes


def _parquet_classes(fs, files: list[str]) -> list[str]:
    """Class names from the schema metadata, a classes.json beside the shards, or "0".."K-1" from the labels."""
    meta = pq.read_schema(files[0], filesystem=fs).metadata or {}
    if b"classes" in meta:
        return list(json.loads(meta[b"classes"]))
    for folder in dict.fromkeys(posixpath.dirname(f) for f in files[:1] + files[-1:]):
        for d in (folder, posixpath.dirname(folder)):
            p = posixpath.join(d, "classes.json")
            if fs.get_file_info(p).type == pafs.FileType.File:
                with fs.open_input_stream(p) as f:
                    return list(json.loads(f.read()))
    max_label = max((pc.max(pq.read_table(f, columns=["label"], filesystem=fs)["label"]).as_py() or 0)
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
    fmt = check_source(cfg)
    location = cfg.source
    if fmt == "digits":
        images, labels, classes = load_digits(img_size)
        paths = [f"digits/{i:04d}.png" for i in range(len(labels))]
        return Source(fmt, location, classes, False, {"all": ArrayList(images, labels, paths, classes)})
    if fmt == "cifar":
        folder, kind = _cifar_root(os.path.abspath(os.path.expanduser(location)))
        pools, classes = _cifar(folder, kind)
        return Source(fmt, folder, classes, True, pools)
    if fmt == "imagefolder":
        root = os.path.abspath(os.path.expanduser(location))
        dirs = _imagefolder_splits(root)
        classes = sorted({c for d in dirs.values() if os.path.isdir(d) for c in _subdirs(d)})
        pools = {}
        for split, d in dirs.items():
            paths, labels = [], []
            for label, c in enumerate(classes):
                files = _walk_images(os.path.join(d, c)) if os.path.isdir(os.path.join(d, c)) else []
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
        names = pq.read_schema(f, filesystem=src.fs).names
        t = pq.read_table(f, columns=["label"] + (["path"] if "path" in names else []), filesystem=src.fs)
        lab = t["label"].to_numpy(zero_copy_only=False).astype(np.int64)
        pth = t["path"].to_pylist() if "path" in names else [None] * len(lab)
        idx = np.arange(len(lab))
        if keep_val is not None:
            keys = list(pth)
            if any(k is None for k in keys):  # no path: hash the image bytes
                img = pq.read_table(f, columns=["image"], filesystem=src.fs)["image"].to_pylist()
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


def _concat(pools: list[ImageList]) -> ImageList:
    labels = np.concatenate([p.labels for p in pools])
    paths = [p for pool in pools for p in pool.paths]
    if isinstance(pools[0], ArrayList):
        return ArrayList(np.concatenate([p.images for p in pools]), labels, paths, pools[0].classes)
    return FileList(pools[0].root, labels, paths, pools[0].classes)
