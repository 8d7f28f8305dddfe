"""``ropim data convert SRC DST``: any source → Parquet shards that Ray Data streams: ``image``, ``label``, ``path``
(``--task segment``: ``image``, ``mask``, ``path``; the rows are the source's items, ``ropim.data.lists``).

Layout written: ``DST/train-00000.parquet`` … and, when the source has its own val split, ``DST/val-00000.parquet``
…; class names in each shard's schema metadata (``classes``, a JSON list) and in ``DST/classes.json``. A source
without its own split goes wholly into ``train-*`` shards; readers then split it with the seeded fraction rule on
``path``, which gives the same split as the source had (the built-in digits, split by a permutation, are split by
that rule once converted). Encoded files (ImageFolder, folder pairs, Parquet) keep their original bytes; arrays
(digits, CIFAR) and label maps are stored as PNG (lossless).

Nothing is lost: the destination may not be the source, inside it or around it; ``DST/ropim_convert.json`` records
the plan (source, settings, every shard) before the first shard is written; a destination holding another plan, or
files convert did not write, is refused — convert deletes nothing but its own temporary files and what holds no image
(``ropim.data.destination``). Bounded memory and restartable: shard ``i`` holds items ``[i·N, (i+1)·N)`` of the
split's order (a seeded shuffle of the items, or their order with ``--shuffle false``), written to a hidden temporary
name and renamed when complete, so re-running the same command keeps every complete shard that holds a row and
writes the rest. A Parquet source is shuffled through a staging folder in DST, so that each source shard is read once
(``ropim.data.staging``). An
image that does not decode follows ``on_bad_image`` (dropped and counted, or the run stops); a source item that
cannot be read at all (the source changed or vanished) stops the run with an error, never counted as a bad image. A
split none of whose items decodes is an error naming the source, not an empty data set.
"""

from __future__ import annotations

import json
import posixpath
import sys
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tqdm import tqdm

from ropim.checks import check_folder, check_location
from ropim.data.config import DataConfig
from ropim.data.decode import BadImages
from ropim.data.destination import (
    META_KEY,
    check_destination,
    claim_destination,
    guarded,
    kept_shard,
    remove_if_empty,
    write_whole,
)
from ropim.data.formats.common import CLASSIFY, Source
from ropim.data.formats.parquet import filesystem
from ropim.data.lists import Items
from ropim.data.sources import open_source
from ropim.data.staging import staged_shards
from ropim.errors import ConfigError
from ropim.paths import is_uri, resolve_path

ROW_GROUP = 256  # rows per write call; bounds memory to one row group of encoded images


@dataclass
class ConvertReport:
    """What a conversion did."""

    dst: str
    shards_written: int = 0
    shards_kept: int = 0
    images: dict[str, int] = field(default_factory=dict)  # rows per split in DST after the run
    bad_images: int = 0  # items dropped as undecodable, over all shards in DST
    bad_paths: list[str] = field(default_factory=list)  # the first 20 found by this run


def plan_shards(lists: dict[str, Items], shard_size: int, shuffle: bool, seed: int,
                source: dict) -> dict[str, tuple[str, np.ndarray, dict]]:
    """{shard file name: (split, item indices, the plan stored in the shard)} of every shard to hold."""
    plans = {}
    for split, images in lists.items():
        order = np.random.default_rng(seed).permutation(len(images)) if shuffle else np.arange(len(images))
        n_shards, digest = -(-len(order) // shard_size), images.digest()
        for k in range(n_shards):
            plans[f"{split}-{k:05d}.parquet"] = (split, order[k * shard_size:(k + 1) * shard_size], {
                "split": split, "index": k, "shards": n_shards, "shard_size": shard_size, "items": len(order),
                "digest": digest, "shuffle": shuffle, "seed": seed, **source})
    return plans


def shard_rows(items: Items, idx: np.ndarray, bad: BadImages, progress: tqdm):
    """Row groups of ``items[idx]`` (``Items.row``): undecodable items follow the policy; unreadable ones raise."""
    for start in range(0, len(idx), ROW_GROUP):
        cols = {name: [] for name in items.SCHEMA.names}
        for i in idx[start:start + ROW_GROUP]:
            row = items.row(int(i), bad)
            for name in cols if row else ():
                cols[name].append(row[name])
            progress.update(1)
        yield cols


def write_shard(fs, root: str, name: str, rows, schema: pa.Schema) -> None:
    """Write one shard via a temporary file renamed into place when complete."""
    tmp, final = posixpath.join(root, f".{name}.tmp"), posixpath.join(root, name)
    try:
        with pq.ParquetWriter(tmp, schema, filesystem=fs) as writer:
            for cols in rows:
                writer.write_table(pa.table(cols, schema=schema))
        fs.move(tmp, final)
    except BaseException:
        if fs.get_file_info(tmp).type == pafs.FileType.File:
            fs.delete_file(tmp)
        raise


def convert(cfg: DataConfig, dst: str, shard_size: int = 1000, *, shuffle: bool = True, seed: int = 0,
            progress: bool = True) -> ConvertReport:
    """Convert the source ``cfg`` (a ``SegDataConfig``: its pairs) to Parquet shards in ``dst`` (a folder or URI);
    resumable, see module doc."""
    check_request(dst, shard_size)
    cfg, dst = cfg.resolved().validate(), resolve_path(dst)
    if cfg.source != "digits":
        check_destination(cfg.source, dst)
    src = open_source(cfg)
    lists = {s: src.split(s, cache_files=1) for s in ("train", "val")} if src.own_split else \
        {"train": src.split(None, cache_files=1)}
    fs, root = filesystem(dst)
    if fs.get_file_info(root).type == pafs.FileType.File:
        raise ConfigError(f"convert destination {dst!r} is a file; give a folder")
    created = fs.get_file_info(root).type == pafs.FileType.NotFound
    fs.create_dir(root, recursive=True)
    with guarded(fs, root, dst):  # two conversions into one folder at once would remove each other's files
        try:
            report = write_all(src, lists, fs, root, dst, shard_size, shuffle, seed, progress)
        except BaseException:
            remove_if_empty(fs, root, created)
            raise
        empty = [split for split, n in report.images.items() if not n]
        if empty:
            raise none_converted(src, len(lists[empty[0]]), empty[0], report, remove_if_empty(fs, root, created))
    return report


def none_converted(src: Source, n: int, split: str, report: ConvertReport, removed: bool) -> ConfigError:
    """The one error for a conversion that left a split without a row: none of its ``n`` items decodes."""
    noun = "pairs" if src.cfg.TASK != CLASSIFY else "images"
    what = f"the {n} {noun} of its {split} split" if src.own_split else f"its {n} {noun}"
    example = f" (e.g. {report.bad_paths[0]})" if report.bad_paths else ""
    left = "" if removed else f" ({report.dst} keeps the shards written, which readers refuse; the same command " \
        "replaces them)"
    return ConfigError(f"data source {src.location!r}: none of {what} decodes{example}, so no data set was "
                       f"written{left}; replace or remove the bad files (JPEG, PNG, WebP, BMP or GIF images) and "
                       "convert again")


def check_request(dst: str, shard_size: int) -> None:
    """The checks of a conversion's own arguments, before its source is opened."""
    if shard_size < 1:
        raise ConfigError(f"shard_size={shard_size}: must be ≥ 1")
    check_location(dst, "convert destination")
    if not is_uri(dst):
        check_folder(dst, "convert destination")


def write_all(src: Source, lists: dict[str, Items], fs, root: str, dst: str, shard_size: int, shuffle: bool,
              seed: int, progress: bool) -> ConvertReport:
    """Claim the destination with the plan, then write every shard it lacks."""
    cfg, items = src.cfg, next(iter(lists.values()))
    task = {"task": cfg.TASK} if cfg.TASK != CLASSIFY else {}
    plans = plan_shards(lists, shard_size, shuffle, seed, {"format": src.format, "source": src.location, **task,
                                                           "on_bad_image": cfg.on_bad_image})
    claim_destination(fs, root, dst, {"source": src.location, "format": src.format, **task,
                                      "classes": src.classes, "shards": {n: p[2] for n, p in plans.items()}})
    keep = {n for n, p in plans.items() if kept_shard(fs, posixpath.join(root, n), p[2])}
    report = ConvertReport(dst=dst, shards_kept=len(keep))
    classes = json.dumps(src.classes)
    write_whole(fs, posixpath.join(root, "classes.json"), classes.encode())
    bad = BadImages(cfg.on_bad_image, cfg.max_pixels)
    total, done = sum(len(v) for v in lists.values()), sum(len(plans[n][1]) for n in keep)
    todo = staged_shards(fs, root, lists, plans, keep, progress) if shuffle and src.format == "parquet" else \
        (n for n in plans if n not in keep)  # a shuffled Parquet source goes through staging (its module doc)
    with tqdm(total=total, initial=done, unit=items.UNIT, desc=f"convert → {dst}", disable=not progress,
              file=sys.stdout) as bar:  # stderr stays for errors
        for name in todo:
            split, idx, meta = plans[name]
            schema = items.SCHEMA.with_metadata({b"classes": classes.encode(), META_KEY: json.dumps(meta).encode()})
            write_shard(fs, root, name, shard_rows(lists[split], idx, bad, bar), schema)
            report.shards_written += 1
    for name, (split, idx, _) in plans.items():
        rows = pq.read_metadata(posixpath.join(root, name), filesystem=fs).num_rows
        report.images[split] = report.images.get(split, 0) + rows
        report.bad_images += len(idx) - rows
    report.bad_paths = bad.paths
    return report
