"""How a split's images are held and read: in-memory arrays (digits, CIFAR), files under a root, or rows of
Parquet shards. No torch, no Ray, no MLflow."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa

from ropim.data import footers
from ropim.data.layout import PARQUET_ERRORS, unreadable_parquet


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

    def head(self, k: int) -> list[tuple[str, bytes | np.ndarray | None]]:
        """(path, data) of up to ``k`` of the first images (None: the file cannot be read): a cheap sample."""
        out = []
        for i in range(min(k, len(self))):
            try:
                out.append((self.paths[i], self.load(i)))
            except OSError:
                out.append((self.paths[i], None))
        return out


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
            try:
                col = footers.read_columns(self.fs, self.files[f], ["image"])["image"]
            except PARQUET_ERRORS as err:
                raise unreadable_parquet(self.files[f], self.files[f], err) from None
            self._cache[f] = col.take(pa.array(self.rows[f]))
        return self._cache[f][i - int(self.offsets[f])].as_py()

    def head(self, k: int) -> list[tuple[str, bytes]]:
        """(path, bytes) of up to ``k`` of the first images, from the first row group of the first shard that holds
        any of them: one row group is read (256 rows in shards ``ropim data convert`` writes), not the shard."""
        f = next((j for j, rows in enumerate(self.rows) if len(rows)), None)
        if f is None:
            return []
        try:
            group = footers.read_columns(self.fs, self.files[f], ["image"], row_group=0)["image"]
        except PARQUET_ERRORS as err:
            raise unreadable_parquet(self.files[f], self.files[f], err) from None
        rows = self.rows[f][self.rows[f] < len(group)][:k]
        start = int(self.offsets[f])
        return [(self.paths[start + j], group[int(r)].as_py()) for j, r in enumerate(rows)]

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


def digits_count() -> int:
    """How many images the built-in digits hold (scikit-learn's labels only: no torch, no resize)."""
    from sklearn.datasets import load_digits as sk_digits

    return len(sk_digits().target)


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


def read_cifar(folder: str, kind: str) -> tuple[dict[str, ArrayList], list[str]]:
    """The train and test batches of a CIFAR-10 / CIFAR-100 python folder as ArrayLists, and the class names."""
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

