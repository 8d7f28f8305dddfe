"""Where a data set lives and which format it has: local paths and URIs, Parquet shards, CIFAR and ImageFolder
layouts, format detection and the cheap pre-flight check of a source. No torch, no Ray, no MLflow.

Formats (``DataConfig.format``; ``auto`` detects them in this order):

* ``digits``      scikit-learn's built-in 8×8 digits (``source="digits"``), upscaled, RGB.
* ``parquet``     shards with an encoded ``image`` column, an int ``label`` column and optionally ``path``:
                  a folder (searched recursively), a glob, one file, or any URI pyarrow's filesystems read
                  (``s3://…``, ``gs://…``, ``hdfs://…``).
* ``cifar``       CIFAR-10/100 python pickles (``cifar-10-batches-py/``, ``cifar-100-python/``, or their parent).
* ``imagefolder`` ``ROOT/<class>/<image>`` (any depth below the class folder), or ``ROOT/train/<class>/…`` and
                  ``ROOT/val/<class>/…``. JPEG/PNG/WebP/BMP/GIF; greyscale, RGBA and palette images become RGB.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath

import pyarrow as pa
import pyarrow.fs as pafs

from ropim.data import footers
from ropim.errors import ConfigError
from ropim.filesystems import filesystem as open_location
from ropim.paths import is_uri

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
VAL_NAMES = ("val", "validation", "test")
HINT = ("give 'digits', an ImageFolder tree (ROOT/<class>/<image>), a CIFAR python folder "
        "(cifar-10-batches-py/), or Parquet shards (a folder, glob or s3:// URI)")


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or a URI such as ``s3://bucket/prefix``."""
    if is_uri(location):
        try:
            return open_location(location)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
            raise ConfigError(f"data source {location!r}: cannot open this URI ({err}); {HINT}") from None
    return open_location(location)


PARQUET_ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises on a file cut short or not Parquet


def unreadable_parquet(location: str, file: str, err: Exception) -> ConfigError:
    """The one error for a shard that cannot be read as Parquet, naming it and the fix."""
    why = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ConfigError(f"data source {location!r}: {file} cannot be read as Parquet ({why}); it is cut short or not "
                       "a Parquet file: write it again (`ropim data convert` rewrites a shard that is missing) or move "
                       "it out of the data set")


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


def cifar_root(path: str) -> tuple[str, str] | None:
    """(folder, 'cifar10' | 'cifar100') when ``path`` is, or directly holds, a CIFAR python folder."""
    for d in (path, os.path.join(path, "cifar-10-batches-py"), os.path.join(path, "cifar-100-python")):
        if os.path.isfile(os.path.join(d, "batches.meta")) and os.path.isfile(os.path.join(d, "test_batch")):
            return d, "cifar10"
        if all(os.path.isfile(os.path.join(d, f)) for f in ("meta", "train", "test")):
            return d, "cifar100"
    return None


def is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


def inside(path: str, root: str) -> bool:
    """Whether real path ``path`` is ``root`` or below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def walk_images(folder: str, first_only: bool = False, root: str | None = None) -> list[str]:
    """Image files below ``folder`` (sorted, recursive); stop at the first if asked. Symbolic links are followed only
    to folders and files inside ``root`` (default: ``folder``), and every real folder and file is listed once, so a
    link cycle cannot multiply the images and a link cannot leak one image into both splits."""
    root_real, seen = os.path.realpath(root or folder), set()
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen or not inside(real, root_real):
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            target = os.path.realpath(os.path.join(dirpath, f))
            if is_image(f) and target not in seen and inside(target, root_real):
                seen.add(target)
                out.append(os.path.join(dirpath, f))
                if first_only:
                    return out
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


def _holds_parquet(folder: str) -> bool:
    """Parquet files directly in ``folder`` or one level down (train/, val/); no deep walk."""
    for d in [folder] + [os.path.join(folder, s) for s in subdirs(folder)]:
        if any(f.endswith(".parquet") and not f.startswith((".", "_")) for f in os.listdir(d)):
            return True
    return False


def detect_format(source: str, forced: str = "auto") -> str:
    """The format of ``source`` (``forced`` checked, or detected); ConfigError naming the path otherwise."""
    location = source
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
    if forced == "cifar" or (forced == "auto" and cifar_root(path)):
        if not cifar_root(path):
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


def check_source(source: str, forced: str = "auto") -> str:
    """Cheap pre-flight check that the source exists and holds images; returns its format.

    Raises one ConfigError naming the path and the fix (missing path, no images, empty shards, missing
    columns). Stops at the first image found, so it is fast on large trees. ``DataConfig.validate()``
    calls it, so ``PretrainConfig.validate()`` runs it before Ray starts.
    """
    fmt = detect_format(source, forced)
    location = source
    if fmt == "parquet":
        fs, files = parquet_files(location)
        rows = 0
        for f in files:  # every footer: a shard cut short fails here, before any work starts
            try:
                rows += footers.num_rows(fs, f)
            except PARQUET_ERRORS as err:
                raise unreadable_parquet(location, f, err) from None
        schema = footers.schema(fs, files[0])
        missing = [c for c in ("image", "label") if c not in schema.names]
        if missing:
            raise ConfigError(f"data source {location!r}: {files[0]} has no {' / '.join(missing)} column "
                              f"(columns: {', '.join(schema.names)}); write shards with `ropim data convert`")
        label = schema.field("label").type
        if not pa.types.is_integer(label):
            raise ConfigError(f"data source {location!r}: {files[0]}'s label column holds {label}, not integers; "
                              "labels are class indices 0..K-1 (class names go in the schema metadata or "
                              "classes.json): rewrite the shards with `ropim data convert`")
        if not rows:
            raise ConfigError(f"data source {location!r}: {len(files)} Parquet file(s) but no rows; "
                              f"the data set is empty")
    elif fmt == "imagefolder":
        path = os.path.abspath(os.path.expanduser(location))
        for folder in imagefolder_splits(path).values():
            if os.path.isdir(folder) and any(walk_images(os.path.join(folder, c), True, path) for c in subdirs(folder)):
                continue
            loose = [f for f in os.listdir(folder) if is_image(f)] if os.path.isdir(folder) else []
            where = f"{len(loose)} images directly in {folder} but no class folders" if loose else \
                f"no images ({'/'.join(IMAGE_EXTENSIONS)}) in class folders under {folder}"
            raise ConfigError(f"data source {location!r}: {where}; an ImageFolder needs ROOT/<class>/<image> "
                              f"(or ROOT/train/<class>/… and ROOT/val/<class>/…)")
    return fmt


# ------------------------------------------------------------------------------------------------- lists

