"""``ropim data convert SRC DST --task segment``: a segmentation source → Parquet shards (``image``, ``mask``,
``path``), with the same guarantees as ``ropim.data.convert`` (a plan written first, shards renamed into place when
complete, a re-run keeps them and writes the rest, nothing of another conversion touched).

Both splits are written (``train-*``, ``val-*``), so a source split by the seeded fraction keeps its split. Images
keep their original bytes (PNG for the built-in digits); masks are stored as PNG label maps already in 0..K-1 with
255 = ignore (ADE20K's labels shifted), the class names in the metadata and ``classes.json``. Every pair is decoded
and checked (sizes, label range): a mismatch stops the conversion naming the pair; an undecodable file follows
``on_bad_image``.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import sys

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from PIL import Image
from tqdm import tqdm

from ropim.checks import check_location
from ropim.data.convert import (
    META_KEY,
    ROW_GROUP,
    ConvertReport,
    check_destination,
    claim_destination,
    complete_shard,
    encode,
    plan_shards,
    write_shard,
    write_whole,
)
from ropim.data.decode import BadImages
from ropim.data.layout import filesystem
from ropim.data.seg_config import SegDataConfig
from ropim.data.seg_sources import SegList, SegSource, open_seg_source
from ropim.errors import ConfigError

SEG_SCHEMA = pa.schema([("image", pa.binary()), ("mask", pa.binary()), ("path", pa.string())])


def png(mask: np.ndarray) -> bytes:
    """A label map as a lossless 8-bit PNG."""
    buf = io.BytesIO()
    Image.fromarray(mask.astype(np.uint8)).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def pair_rows(src: SegSource, pairs: SegList, idx: np.ndarray, bad: BadImages, progress: tqdm):
    """Row groups (image, mask, path) of ``idx``: checked; undecodable pairs follow the policy."""
    for start in range(0, len(idx), ROW_GROUP):
        cols = {"image": [], "mask": [], "path": []}
        for i in idx[start:start + ROW_GROUP]:
            path = pairs.paths[i]
            try:
                image_data = pairs.raw(int(i))[0]
                _, mask = pairs.load(int(i), bad.max_pixels)
            except ConfigError:
                raise
            except Exception as err:  # noqa: BLE001 — an unreadable or undecodable file makes the pair bad
                bad.add(path, err)
                progress.update(1)
                continue
            rel = os.path.relpath(path, src.location) if os.path.isabs(path) else path
            cols["image"].append(encode(image_data))
            cols["mask"].append(png(mask))
            cols["path"].append(rel.replace(os.sep, "/"))
            progress.update(1)
        yield cols


def convert_segments(cfg: SegDataConfig, dst: str, shard_size: int = 1000, *, shuffle: bool = True, seed: int = 0,
                     progress: bool = True) -> ConvertReport:
    """Convert the segmentation source ``cfg`` to Parquet shards in ``dst`` (a folder or URI); resumable."""
    if shard_size < 1:
        raise ConfigError(f"shard_size={shard_size}: must be ≥ 1")
    check_location(dst, "convert destination")
    cfg.validate()
    if cfg.source != "digits":
        check_destination(cfg.source, dst)
    src = open_seg_source(cfg)
    fs, root = filesystem(dst)
    if fs.get_file_info(root).type == pafs.FileType.File:
        raise ConfigError(f"convert destination {dst!r} is a file; give a folder")
    created = fs.get_file_info(root).type == pafs.FileType.NotFound
    fs.create_dir(root, recursive=True)
    try:
        return write_pairs(cfg, src, fs, root, dst, shard_size, shuffle and src.format != "parquet", seed, progress)
    except BaseException:
        if created and not any(i.base_name.endswith(".parquet") for i in fs.get_file_info(pafs.FileSelector(root))):
            fs.delete_dir(root)  # nothing whole was written: leave no trace of this run
        raise


def write_pairs(cfg: SegDataConfig, src: SegSource, fs, root: str, dst: str, shard_size: int, shuffle: bool,
                seed: int, progress: bool) -> ConvertReport:
    """Claim the destination with the plan, then write every shard it lacks."""
    plans = plan_shards(src.splits, shard_size, shuffle, seed, {"format": src.format, "source": src.location,
                                                               "task": "segment", "on_bad_image": cfg.on_bad_image})
    claim_destination(fs, root, dst, {"source": src.location, "format": src.format, "task": "segment",
                                      "classes": src.classes, "shards": {n: p[2] for n, p in plans.items()}})
    keep = {n for n, p in plans.items() if complete_shard(fs, posixpath.join(root, n), p[2])}
    report = ConvertReport(dst=dst, shards_kept=len(keep))
    classes = json.dumps(src.classes)
    write_whole(fs, posixpath.join(root, "classes.json"), classes.encode())
    bad = BadImages(cfg.on_bad_image, cfg.max_pixels)
    total, done = sum(len(v) for v in src.splits.values()), sum(len(plans[n][1]) for n in keep)
    with tqdm(total=total, initial=done, unit="pair", desc=f"convert → {dst}", disable=not progress,
              file=sys.stdout) as bar:
        for name, (split, idx, meta) in plans.items():
            if name not in keep:
                schema = SEG_SCHEMA.with_metadata({b"classes": classes.encode(), META_KEY: json.dumps(meta).encode()})
                write_shard(fs, root, name, pair_rows(src, src.splits[split], idx, bad, bar), schema)
                report.shards_written += 1
    for name, (split, idx, _) in plans.items():
        rows = pq.read_metadata(posixpath.join(root, name), filesystem=fs).num_rows
        report.images[split] = report.images.get(split, 0) + rows
        report.bad_images += len(idx) - rows
    report.bad_paths = bad.paths
    return report
