"""Parquet shards, local or at any URI pyarrow's filesystems read (``s3://…``, ``gs://…``, ``hdfs://…``): a folder
(searched recursively), a glob or one file. Classification shards hold an encoded ``image``, an int ``label`` and
optionally ``path``; segmentation shards ``image``, ``mask`` (PNG) and ``path`` (``ropim data convert --task
segment``); an ``image`` (or ``mask``) may also be a Hugging Face ``Image`` feature (a struct of ``bytes`` and
``path``). Files named ``train-*`` / ``val-*`` / ``validation-*`` (or in ``train/`` / ``val/``) are the split. Class
names: the schema metadata ``classes`` (JSON list) or a Hugging Face ``ClassLabel``'s names, else ``classes.json``
beside the shards, else ``"0"…"K-1"`` (segmentation: ``data.num_classes``). Every footer is read through
``ropim.data.footers``. No torch, no Ray, no MLflow."""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ropim.data import footers
from ropim.data.formats.common import CLASSIFY, SEGMENT, VAL_NAMES, Source, class_names, in_val
from ropim.data.formats.parquet_rows import ERRORS, ParquetList, ParquetSegList, encoded, row_name, unreadable
from ropim.data.lists import Items
from ropim.errors import ConfigError, DataError
from ropim.filesystems import filesystem as open_location
from ropim.paths import is_uri

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import DataConfig

NAME = "parquet"
TASKS = (CLASSIFY, SEGMENT)
HINT = "give a folder, glob or URI of Parquet shards (`ropim data convert` writes them)"
COLUMNS = {CLASSIFY: ("image", "label"), SEGMENT: ("image", "mask")}
PLAN = "ropim_convert.json"  # what ``ropim data convert`` plans to write in its destination (ropim.data.destination)


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for a local path or a URI such as ``s3://bucket/prefix``."""
    try:
        return open_location(location)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as err:
        if not is_uri(location):
            raise
        raise ConfigError(f"data source {location!r}: cannot open this URI ({err}); {HINT}") from None


def hidden(relpath: str) -> bool:
    return any(part.startswith((".", "_")) for part in relpath.split("/"))


def parquet_files(location: str) -> tuple[pafs.FileSystem, list[str]]:
    """The Parquet shards at a folder (recursive), glob or file; hidden/temporary files are ignored."""
    fs, path = filesystem(location)
    glob = any(c in path for c in "*?[")  # in the path: a URI's ?query is not a glob
    if glob:
        base = path[: min(path.find(c) for c in "*?[" if c in path)].rpartition("/")[0] or "/"
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, path)
                 and not hidden(posixpath.relpath(i.path, base))]
        plan = read_plan(fs, base)  # the shards of a conversion into base that the glob names: all of them written
        planned = {s: v for s, v in (plan or {}).get("shards", {}).items()
                   if fnmatch.fnmatch(posixpath.join(base, s), path)}
        check_finished(location, {"shards": planned}, {posixpath.relpath(f, base) for f in files})
    else:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise ConfigError(f"data source {location!r}: no such file or folder; {HINT}")
        if info.type == pafs.FileType.File:
            return fs, [path]
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
        files = [i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(".parquet")
                 and not hidden(posixpath.relpath(i.path, path))]
        check_finished(location, read_plan(fs, path), {posixpath.relpath(f, path) for f in files})
    if not files:
        raise ConfigError(f"data source {location!r}: no Parquet files found; {HINT}")
    return fs, sorted(files)


def read_plan(fs: pafs.FileSystem, root: str) -> dict | None:
    """The plan a conversion recorded in the folder ``root``, or None."""
    plan_path = posixpath.join(root, PLAN)
    if fs.get_file_info(plan_path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(plan_path) as f:
        return json.loads(f.read().decode())


def check_finished(location: str, plan: dict | None, files: set[str]) -> None:
    """A conversion's destination holds every shard its plan names: one stopped, or still running, would be read
    as a smaller data set (a source's own val split missing: val cut from train). ConfigError otherwise."""
    missing = sorted(set((plan or {}).get("shards", {})) - files)
    if missing:
        planned = len(plan["shards"])
        raise ConfigError(f"data source {location!r} is an unfinished `ropim data convert` ({planned - len(missing)} "
                          f"of its {planned} shards written, {missing[0]} not yet): run the same convert command "
                          "again to finish it (it writes the missing shards only)")


def split_of(file: str) -> str | None:
    """'train' / 'val' / 'test' from a shard's name (``train-00000.parquet``) or folder (``val/part-0.parquet``)."""
    parent, name = posixpath.split(file)
    for word in (name.split(".")[0].replace("_", "-").split("-")[0], posixpath.basename(parent)):
        if word in ("train", "test"):
            return word
        if word in VAL_NAMES:
            return "val"
    return None


def detect(path: str) -> bool:
    """A ``.parquet`` file, or a folder with Parquet files in it or one level down (train/, val/); no deep walk."""
    if os.path.isfile(path):
        return path.endswith(".parquet")
    folders = [path] + [e.path for e in os.scandir(path) if e.is_dir() and not e.name.startswith(".")]
    return any(f.endswith(".parquet") and not f.startswith((".", "_")) for d in folders for f in os.listdir(d))


def check(cfg: DataConfig) -> None:
    """Every footer reads (a shard cut short fails here, before any work starts), the first holds the task's
    columns (classification: integer labels), and the shards hold rows."""
    fs, files = parquet_files(cfg.source)
    rows = 0
    for f in files:
        try:
            rows += footers.num_rows(fs, f)
        except ERRORS as err:
            raise unreadable(cfg.source, f, err) from None
    schema = footers.schema(fs, files[0])
    missing = [c for c in COLUMNS[cfg.TASK] if c not in schema.names]
    if missing:
        task = " --task segment" if cfg.TASK == SEGMENT else ""
        raise ConfigError(f"data source {cfg.source!r}: {files[0]} has no {' / '.join(missing)} column "
                          f"(columns: {', '.join(schema.names)}); write shards with `ropim data convert SRC DST{task}`")
    kind = schema.field("image").type
    kind = kind.field("bytes").type if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0 else kind
    if not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise ConfigError(f"data source {cfg.source!r}: {files[0]}'s image column holds {schema.field('image').type}, "
                          "not encoded images (binary, or a Hugging Face Image struct of bytes and path): rewrite the "
                          "shards with `ropim data convert`")
    if cfg.TASK == CLASSIFY and not pa.types.is_integer(schema.field("label").type):
        raise ConfigError(f"data source {cfg.source!r}: {files[0]}'s label column holds {schema.field('label').type}, "
                          "not integers; labels are class indices 0..K-1 (class names go in the schema metadata or "
                          "classes.json): rewrite the shards with `ropim data convert`")
    if not rows:
        raise ConfigError(f"data source {cfg.source!r}: {len(files)} Parquet file(s) but no rows; the data set is "
                          "empty")


def classes_of(cfg: DataConfig, fs, files: list[str]) -> list[str]:
    """Class names from the schema metadata, a classes.json beside the shards (segmentation: as many as
    ``data.num_classes`` when set), or numbered: "0".."K-1" from the labels (classification) or
    ``data.num_classes`` (segmentation)."""
    count = cfg.num_classes if cfg.TASK == SEGMENT else None
    meta = footers.schema(fs, files[0]).metadata or {}
    if b"classes" in meta:
        return class_names(json.loads(meta[b"classes"]), f"{files[0]}'s schema metadata", count)
    label = json.loads(meta.get(b"huggingface", b"{}")).get("info", {}).get("features", {}).get("label", {})
    if label.get("_type") == "ClassLabel" and label.get("names"):
        return class_names(label["names"], f"{files[0]}'s Hugging Face features", count)
    for folder in dict.fromkeys(posixpath.dirname(f) for f in files[:1] + files[-1:]):
        for d in (folder, posixpath.dirname(folder)):
            p = posixpath.join(d, "classes.json")
            if fs.get_file_info(p).type == pafs.FileType.File:
                with fs.open_input_stream(p) as f:
                    return class_names(json.loads(f.read()), p, count)
    if cfg.TASK == SEGMENT:
        if not cfg.num_classes:
            raise ConfigError(f"data source {cfg.source!r}: no class names in the shards' metadata; set "
                              "data.num_classes")
        return [str(i) for i in range(cfg.num_classes)]
    max_label = max((pc.max(footers.read_columns(fs, f, ["label"])["label"]).as_py() or 0) for f in files)
    return [str(i) for i in range(max_label + 1)]


@dataclass
class ParquetSource(Source):
    """Shards grouped by split ('train' / 'val', or 'all'), listed when a split is asked for (footers only)."""

    fs: pafs.FileSystem | None = None
    files: dict[str, list[str]] = field(default_factory=dict)

    @property
    def own_split(self) -> bool:
        return "all" not in self.files

    def shards(self, name: str | None) -> tuple[list[str], bool | None]:
        """The files holding split ``name`` (None: every file), and which of their rows to keep: the val side of the
        seeded fraction (True), the train side (False) or all (None)."""
        if name is None:
            return [f for group in self.files.values() for f in group], None
        if self.own_split:
            return self.files[name], None
        return self.files["all"], name == "val"

    def listed(self, name: str | None, cache_files: int | None) -> Items:
        files, keep_val = self.shards(name)
        rows, labels, paths = [], [], []
        for f in files:
            lab, pth, idx = self.rows_of(f, keep_val)
            rows.append(idx)
            labels.append(lab[idx])
            paths += [pth[i] if pth[i] is not None else row_name(f, i) for i in idx]
        if self.cfg.TASK == SEGMENT:
            return ParquetSegList(self.fs, files, rows, paths, len(self.classes), cache_files)
        labels = np.concatenate(labels) if labels else np.zeros(0, np.int64)
        return ParquetList(self.fs, files, rows, labels, paths, self.classes, cache_files)

    def rows_of(self, f: str, keep_val: bool | None) -> tuple[np.ndarray, list, np.ndarray]:
        """(labels: checked against the classes, paths, the rows kept) of shard ``f``."""
        names = footers.schema(self.fs, f).names
        label = "label" if self.cfg.TASK == CLASSIFY else None
        try:
            t = footers.read_columns(self.fs, f, [c for c in (label, "path") if c in names])
        except ERRORS as err:
            raise unreadable(self.cfg.source, f, err) from None
        n = t.num_rows
        lab = t["label"].to_numpy(zero_copy_only=False).astype(np.int64) if label else np.zeros(n, np.int64)
        if n and label and (lab.min() < 0 or lab.max() >= len(self.classes)):
            raise DataError(f"data source {self.cfg.source!r}: {f} has labels {lab.min()}..{lab.max()}, outside "
                            f"the {len(self.classes)} classes ({', '.join(self.classes[:5])}…); fix the labels or "
                            "the class names")
        pth = t["path"].to_pylist() if "path" in names else [None] * n
        idx = np.arange(n)
        if keep_val is not None:
            keys = list(pth)
            if any(k is None for k in keys):  # no path: hash the image bytes
                img = encoded(footers.read_columns(self.fs, f, ["image"])["image"]).to_pylist()
                keys = [k if k is not None else b for k, b in zip(keys, img, strict=True)]
            idx = idx[in_val(keys, self.cfg.split_seed, self.cfg.val_fraction) == keep_val]
        return lab, pth, idx


def source(cfg: DataConfig, img_size: int = 32) -> Source:
    """The shards, grouped by the split their names give (``img_size``: unused, transforms resize). ``test-*``
    shards are the val split only where no ``val-*`` / ``validation-*`` shard is: beside one they are a benchmark's
    unlabelled test split (Hugging Face's ImageNet-1k: labels -1), left out."""
    fs, files = parquet_files(cfg.source)
    by_split = {"train": [], "val": [], "test": []}
    for f in files:
        by_split[split_of(f) or "train"].append(f)
    tests = by_split.pop("test")
    by_split["val"] = by_split["val"] or tests
    own = bool(by_split["val"]) and bool(by_split["train"])
    return ParquetSource(NAME, cfg.source, classes_of(cfg, fs, files), cfg, {}, fs, by_split if own else {"all": files})
