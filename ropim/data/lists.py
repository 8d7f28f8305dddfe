"""What a split holds, listed, not decoded: ``Items``, and images with class labels (``ImageList``), held as arrays
(digits, CIFAR) or files under a root; images with label maps are ``ropim.data.pair_lists``', and the Parquet formats
add their own (``ropim.data.formats.parquet_rows``). Each gives random access (``load``) and the Parquet row
``ropim data convert`` writes of an item (``row``). No torch, no Ray, no MLflow."""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import numpy as np
import pyarrow as pa
from PIL import Image

from ropim.data.decode import BadImages, try_decode
from ropim.data.item_paths import ItemPaths, joined
from ropim.errors import ConfigError


def png(data: bytes | np.ndarray) -> bytes:
    """Encoded bytes as they are; an array (an RGB image or a label map) as a lossless PNG."""
    if isinstance(data, bytes):
        return data
    buf = io.BytesIO()
    Image.fromarray(data).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def concatenated(parts: list[np.ndarray] | list[ItemPaths]) -> np.ndarray | ItemPaths:
    return joined(parts) if isinstance(parts[0], ItemPaths) else np.concatenate(parts)


class Items:
    """A split's items: ``paths`` (one per item, relative to ``root`` for files), ``len``, ``subset`` and ``concat``,
    and ``row``: the item as a row of ``SCHEMA`` (None when it does not decode and the policy skips it)."""

    SCHEMA: ClassVar[pa.Schema]
    UNIT: ClassVar[str] = "img"  # how progress bars count items
    PER_ITEM: ClassVar[tuple[str, ...]] = ("paths",)  # constructor arguments holding one entry per item
    SHARED: ClassVar[tuple[str, ...]] = ()  # constructor arguments holding for every item

    paths: ItemPaths

    def __len__(self) -> int:
        return len(self.paths)

    def blocks(self) -> np.ndarray | None:
        """Where the blocks of items read together start (offsets, the item count last: a Parquet file's rows);
        None when each item is read alone."""
        return None

    def subset(self, idx: np.ndarray):
        """The items at ``idx``, of the same kind."""
        return type(self)(**{k: getattr(self, k) for k in self.SHARED},
                          **{k: getattr(self, k)[idx] for k in self.PER_ITEM})

    def concat(self, *others: Items):
        """These items followed by ``others`` (of the same kind and root)."""
        parts = (self, *others)
        return type(self)(**{k: getattr(self, k) for k in self.SHARED},
                          **{k: concatenated([getattr(p, k) for p in parts]) for k in self.PER_ITEM})

    def row(self, i: int, bad: BadImages) -> dict | None:
        raise NotImplementedError

    def digest(self) -> str:
        """A short hash of the items (paths and labels, in order): a conversion's plan records it, so that a re-run
        over a source whose files moved, were renamed or relabelled, at the same count, is told apart."""
        h = hashlib.sha256("\0".join(self.paths.array.to_pylist()).encode())
        if (labels := getattr(self, "labels", None)) is not None:
            h.update(np.asarray(labels, np.int64).tobytes())
        return h.hexdigest()[:16]

    def stored_path(self, i: int) -> str | None:
        """Item ``i``'s ``path`` as a conversion writes it (None: the source has no path for it)."""
        return self.paths[i]


def vanished(path: str, err: OSError) -> ConfigError:
    """The error of a conversion whose source item ``path`` cannot be read: it stops, never a bad image."""
    if isinstance(err, PermissionError):
        return ConfigError(f"source item {path} cannot be read ({err.strerror}): make it readable, or remove it, and "
                           "re-run the same command to resume")
    return ConfigError(f"source item {path} cannot be read ({err}); the source changed or vanished while converting: "
                       "restore it and re-run the same command to resume")


class ImageList(Items):
    """Random access to a split's images: ``labels`` (int64), ``paths``, ``classes``; ``load(i)`` → data.

    ``load`` returns encoded bytes or an (H, W, 3) uint8 array (``decode_rgb`` takes both), or raises
    OSError when the file cannot be read.
    """

    SCHEMA = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())])
    kind = "encoded"  # "encoded" (bytes), "file" (local files) or "array"
    PER_ITEM = ("labels", "paths")
    SHARED = ("classes",)

    def __init__(self, labels: np.ndarray, paths: Iterable[str], classes: list[str]) -> None:
        self.labels, self.paths, self.classes = np.asarray(labels, dtype=np.int64), ItemPaths(paths), classes

    def fingerprint(self) -> bytes:
        """What the listed images are, without decoding them: it changes when they do (``ropim probe``'s cache).
        Arrays (``ArrayList``) are read through ``ImageArrayDataset``, which digests them itself."""
        raise NotImplementedError

    def load(self, i: int) -> bytes | np.ndarray:
        raise NotImplementedError

    def head(self, k: int) -> list[tuple[str, bytes | np.ndarray | None]]:
        """(path, data) of up to ``k`` of the first images (None: the file cannot be read): a cheap sample."""
        out = []
        for i in range(min(k, len(self))):
            try:
                out.append((self.paths[i], self.load(i)))
            except OSError:
                out.append((self.paths[i], None))
        return out

    def row(self, i: int, bad: BadImages) -> dict | None:
        """Image ``i``'s bytes (an array as PNG), label and path; an unreadable item stops the conversion."""
        try:
            data = self.load(i)
        except OSError as err:
            raise vanished(self.paths[i], err) from None
        if try_decode(data, self.paths[i], bad) is None:
            return None
        return {"image": png(data), "label": int(self.labels[i]), "path": self.stored_path(i)}


class ArrayList(ImageList):
    """Images held as a uint8 (N, H, W, 3) array (digits, CIFAR)."""

    kind = "array"
    PER_ITEM = ("images", "labels", "paths")

    def __init__(self, images: np.ndarray, labels, paths, classes) -> None:
        super().__init__(labels, paths, classes)
        self.images = images

    def load(self, i: int) -> np.ndarray:
        return self.images[i]



class FileList(ImageList):
    """Image files under ``root``; ``paths`` are relative to it."""

    kind = "file"
    SHARED = ("root", "classes")

    def __init__(self, root: str, labels, paths, classes) -> None:
        super().__init__(labels, paths, classes)
        self.root = root

    def file(self, i: int) -> str:
        return os.path.join(self.root, self.paths[i])

    def load(self, i: int) -> bytes:
        with open(self.file(i), "rb") as f:
            return f.read()

    def fingerprint(self) -> bytes:
        """Each file's path, size and modification time (nothing read): they change when a file does. A file that
        vanished since it was listed counts as missing (loading it will say so, or skip it)."""
        stats = stat_files([self.file(i) for i in range(len(self.paths))])
        return "".join(f"{rel}\0{st[0]}\0{st[1]}\n" if st else f"{rel}\0missing\n"
                       for rel, st in zip(self.paths, stats, strict=True)).encode()


STAT_SAMPLE, SLOW_STAT_S, STAT_THREADS, STAT_CHUNK = 256, 50e-6, 32, 512


def stat_chunk(files: list[str]) -> list[tuple[int, int] | None]:
    """(size, modification time in ns) of each file, None for one that cannot be stat-ed."""
    out = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return out


def stat_files(files: list[str]) -> list[tuple[int, int] | None]:
    """``stat_chunk`` of every file, in order: in this thread where a stat is quick (a local disk: about 3 µs, where
    threads only add overhead), by ``STAT_THREADS`` threads where the first ``STAT_SAMPLE`` took over ``SLOW_STAT_S``
    each (a network or object-store file system, where each stat waits on a round trip)."""
    start = time.perf_counter()
    out = stat_chunk(files[:STAT_SAMPLE])
    rest = files[STAT_SAMPLE:]
    if not rest or time.perf_counter() - start < SLOW_STAT_S * len(out):
        return out + stat_chunk(rest)
    size = min(STAT_CHUNK, -(-len(rest) // (4 * STAT_THREADS)))  # every thread busy on small lists too
    with ThreadPoolExecutor(STAT_THREADS, thread_name_prefix="ropim-stat") as pool:
        for part in pool.map(stat_chunk, [rest[k:k + size] for k in range(0, len(rest), size)]):
            out += part
    return out
