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
import os

import numpy as np
import pyarrow as pa
from PIL import Image
from tqdm import tqdm

from ropim.data.convert import (
    ROW_GROUP,
    ConvertReport,
    Dataset,
    check_destination,
    check_request,
    encode,
    write_dataset,
)
from ropim.data.decode import BadImages
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
    check_request(dst, shard_size)
    cfg.validate()
    if cfg.source != "digits":
        check_destination(cfg.source, dst)
    src = open_seg_source(cfg)
    data = Dataset(src.format, src.location, src.classes, src.splits, SEG_SCHEMA,
                   lambda split, idx, bad, bar: pair_rows(src, src.splits[split], idx, bad, bar), "segment", "pair")
    return write_dataset(data, cfg, dst, shard_size, shuffle, seed, progress)
