"""Helpers that build small data sets in the tests: images, CIFAR-10/100 python folders, Parquet shards."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

RNG = np.random.default_rng(0)


def pixels(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def cifar10(root, n_train=(6, 4), n_test=5, classes=10):
    """The official cifar-10-batches-py layout (Python-2 style pickles: bytes keys) with tiny batches."""
    d = root / "cifar-10-batches-py"
    d.mkdir()
    expect = {"train": ([], []), "val": ([], [])}
    batches = [(f"data_batch_{i + 1}", n, "train") for i, n in enumerate(n_train)] + [("test_batch", n_test, "val")]
    for k, (name, n, split) in enumerate(batches):
        imgs = np.stack([pixels(32, 32, 100 * k + i) for i in range(n)])
        labels = [int(x) for x in RNG.integers(0, classes, n)]
        data = imgs.transpose(0, 3, 1, 2).reshape(n, 3072)
        with open(d / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [f"img_{k}_{i}.png".encode() for i in range(n)]}, f, protocol=2)
        expect[split][0].append(imgs)
        expect[split][1].extend(labels)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(classes)], b"num_vis": 3072}, f, protocol=2)
    return d, {s: (np.concatenate(v[0]), np.array(v[1])) for s, v in expect.items()}


def write_parquet(path, rows, classes=None, with_path=True):
    cols = {"image": [r[0] for r in rows], "label": pa.array([r[1] for r in rows], pa.int64())}
    if with_path:
        cols["path"] = [r[2] for r in rows]
    table = pa.table(cols)
    if classes is not None:
        table = table.replace_schema_metadata({b"classes": json.dumps(classes).encode()})
    pq.write_table(table, path)
