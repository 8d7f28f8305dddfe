"""``ropim data convert SRC DST``: any source → Parquet shards that Ray Data streams (``image``, ``label``, ``path``).

Layout written: ``DST/train-00000.parquet`` … and, when the
source has its own val split, ``DST/val-00000.parquet`` …; class names in each shard's schema metadata
(``classes``, a JSON list) and in ``DST/classes.json``. A source without its own split goes wholly into
``train-*`` shards; readers then split it with the seeded fraction rule on ``path``, which gives the same
split as the source had. Encoded files (ImageFolder, Parquet) keep their original bytes; array sources
(digits, CIFAR) are stored as PNG (lossless).

Bounded memory and restartable: shard ``i`` holds items ``[i·N, (i+1)·N)`` of the split's order (a seeded
shuffle of the items, or the source order for Parquet sources), so every shard is a pure function of
(source, split, index, N, seed). Each is written to a hidden temporary name and renamed when complete, with
that plan stored in its metadata (``ropim.shard``). A re-run keeps shards whose plan matches, rewrites the
rest, removes stale shards of other plans and leftover temporary files. Bad images are verified by decoding
and dropped under ``on_bad_image="skip"`` (a shard may then hold fewer than N rows), or stop the run under
``fail``.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from PIL import Image
from tqdm import tqdm

from ropim.data.config import DataConfig
from ropim.data.decode import BadImages, try_decode
from ropim.data.layout import filesystem
from ropim.data.lists import ImageList
from ropim.data.sources import open_source, split_list
from ropim.errors import ConfigError

log = logging.getLogger("ropim.data")

ROW_GROUP = 256  # rows per write call; bounds memory to one row group of encoded images
META_KEY = b"ropim.shard"
SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())])


@dataclass
class ConvertReport:
    """What a conversion did."""

    dst: str
    shards_written: int = 0
    shards_kept: int = 0
    images: dict[str, int] = field(default_factory=dict)  # rows per split in DST after the run
    bad_images: int = 0  # items dropped as undecodable, over all shards in DST
    bad_paths: list[str] = field(default_factory=list)  # the first 20 found by this run


def _encode(data: bytes | np.ndarray) -> bytes:
    if isinstance(data, bytes):
        return data
    buf = io.BytesIO()
    Image.fromarray(data).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def _order(n: int, shuffle: bool, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)


def _shard_meta(fs, path: str) -> dict | None:
    """The plan stored in a complete shard written by convert, or None (foreign or unreadable file)."""
    try:
        meta = pq.read_schema(path, filesystem=fs).metadata or {}
        return json.loads(meta[META_KEY]) if META_KEY in meta else None
    except (OSError, pa.ArrowInvalid, ValueError):
        return None


def _write_shard(fs, dst: str, name: str, images: ImageList, idx: np.ndarray, schema: pa.Schema,
                 bad: BadImages, progress: tqdm) -> int:
    """Write rows ``idx`` of ``images`` to ``dst/name`` via a temporary file; return rows written."""
    tmp, final = posixpath.join(dst, f".{name}.tmp"), posixpath.join(dst, name)
    rows = 0
    try:
        with pq.ParquetWriter(tmp, schema, filesystem=fs) as writer:
            for start in range(0, len(idx), ROW_GROUP):
                cols = {"image": [], "label": [], "path": []}
                for i in idx[start:start + ROW_GROUP]:
                    path = images.paths[i]
                    try:
                        data = images.load(int(i))
                    except OSError:
                        data = None
                    if try_decode(data, path, bad) is not None:
                        cols["image"].append(_encode(data))
                        cols["label"].append(int(images.labels[i]))
                        cols["path"].append(path)
                    progress.update(1)
                writer.write_table(pa.table(cols, schema=schema))
                rows += len(cols["label"])
        fs.move(tmp, final)
    except BaseException:
        if fs.get_file_info(tmp).type == pafs.FileType.File:
            fs.delete_file(tmp)
        raise
    return rows


def plan_shards(lists: dict[str, ImageList], shard_size: int, shuffle: bool, seed: int,
                source: dict) -> dict[str, tuple[str, np.ndarray, dict]]:
    """{shard file name: (split, item indices, the plan stored in the shard)} of every shard to hold."""
    plans = {}
    for split, images in lists.items():
        order = _order(len(images), shuffle, seed)
        n_shards = -(-len(order) // shard_size)
        for k in range(n_shards):
            plans[f"{split}-{k:05d}.parquet"] = (split, order[k * shard_size:(k + 1) * shard_size], {
                "split": split, "index": k, "shards": n_shards, "shard_size": shard_size, "items": len(order),
                "shuffle": shuffle, "seed": seed, **source})
    return plans


def kept_shards(fs, root: str, dst: str, plans: dict) -> set[str]:
    """The shards already in ``root`` that match their plan; temporary leftovers and stale shards are removed, a
    Parquet file convert did not write is refused."""
    keep = set()
    for info in fs.get_file_info(pafs.FileSelector(root)):
        name = info.base_name
        if info.type != pafs.FileType.File:
            continue
        if name.startswith(".") and name.endswith(".tmp"):
            fs.delete_file(info.path)  # a temporary file left by a killed run
        elif name.endswith(".parquet"):
            meta = _shard_meta(fs, info.path)
            if meta is None:
                raise ConfigError(f"convert destination {dst!r} holds {name}, not written by `ropim data convert`; "
                                  f"give an empty folder or one written by convert")
            if name in plans and meta == plans[name][2]:
                keep.add(name)
            else:
                log.info(f"removing stale shard {name} (written with another plan)")
                fs.delete_file(info.path)
    return keep


def convert(cfg: DataConfig, dst: str, shard_size: int = 1000, *, shuffle: bool = True, seed: int = 0,
            progress: bool = True) -> ConvertReport:
    """Convert the source ``cfg`` to Parquet shards in ``dst`` (a folder or URI); resumable, see module doc."""
    if shard_size < 1:
        raise ConfigError(f"shard_size={shard_size}: must be ≥ 1")
    cfg.validate()
    src = open_source(cfg)
    splits = ("train", "val") if src.own_split else ("train",)
    lists = {s: split_list(src, cfg, s if src.own_split else None, cache_files=1) for s in splits}
    shuffle = shuffle and src.format != "parquet"  # Parquet sources stream in file order
    fs, root = filesystem(dst)
    if fs.get_file_info(root).type == pafs.FileType.File:
        raise ConfigError(f"convert destination {dst!r} is a file; give a folder")
    fs.create_dir(root, recursive=True)

    plans = plan_shards(lists, shard_size, shuffle, seed, {"format": src.format, "source": src.location,
                                                          "on_bad_image": cfg.on_bad_image})
    keep = kept_shards(fs, root, dst, plans)
    report = ConvertReport(dst=dst, shards_kept=len(keep))
    classes = json.dumps(src.classes)
    with fs.open_output_stream(posixpath.join(root, ".classes.json.tmp")) as f:
        f.write(classes.encode())
    fs.move(posixpath.join(root, ".classes.json.tmp"), posixpath.join(root, "classes.json"))

    bad = BadImages(cfg.on_bad_image)
    total = sum(len(v) for v in lists.values())
    done = sum(len(plans[n][1]) for n in keep)
    with tqdm(total=total, initial=done, unit="img", desc=f"convert → {dst}", disable=not progress) as bar:
        for name, (split, idx, meta) in plans.items():
            if name in keep:
                continue
            schema = SCHEMA.with_metadata({b"classes": classes.encode(), META_KEY: json.dumps(meta).encode()})
            _write_shard(fs, root, name, lists[split], idx, schema, bad, bar)
            report.shards_written += 1
    for name, (split, idx, _) in plans.items():
        rows = pq.read_metadata(posixpath.join(root, name), filesystem=fs).num_rows
        report.images[split] = report.images.get(split, 0) + rows
        report.bad_images += len(idx) - rows
    report.bad_paths = bad.paths
    return report
