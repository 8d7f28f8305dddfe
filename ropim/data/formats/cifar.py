"""CIFAR-10 / CIFAR-100 python pickles (``cifar-10-batches-py/``, ``cifar-100-python/``, or their parent), for
classification: its own train/test split (test is val). No torch, no Ray, no MLflow."""

from __future__ import annotations

import os
import pickle
from typing import TYPE_CHECKING

import numpy as np

from ropim.data.formats.common import CLASSIFY, Source
from ropim.data.lists import ArrayList
from ropim.errors import ConfigError
from ropim.paths import resolve_path

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import DataConfig

NAME = "cifar"
TASKS = (CLASSIFY,)


def cifar_root(path: str) -> tuple[str, str] | None:
    """(folder, 'cifar10' | 'cifar100') when ``path`` is, or directly holds, a CIFAR python folder."""
    for d in (path, os.path.join(path, "cifar-10-batches-py"), os.path.join(path, "cifar-100-python")):
        if os.path.isfile(os.path.join(d, "batches.meta")) and os.path.isfile(os.path.join(d, "test_batch")):
            return d, "cifar10"
        if all(os.path.isfile(os.path.join(d, f)) for f in ("meta", "train", "test")):
            return d, "cifar100"
    return None


def detect(path: str) -> bool:
    """A CIFAR python folder, or the folder holding one."""
    return cifar_root(path) is not None


def check(cfg: DataConfig) -> None:
    """The folder holds CIFAR's batches (a forced ``format=cifar`` names what it lacks)."""
    if not detect(resolve_path(cfg.source)):
        raise ConfigError(f"data source {cfg.source!r}: not a CIFAR python folder (expected batches.meta + "
                          f"data_batch_* + test_batch, or meta + train + test)")


class CifarUnpickler(pickle.Unpickler):
    """Loads CIFAR's pickles (dicts, lists, numpy arrays) and refuses anything else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"CIFAR file refers to {module}.{name}; not a CIFAR batch")
        return super().find_class(module, name)


def unpickle(path: str) -> dict:
    with open(path, "rb") as f:
        d = CifarUnpickler(f, encoding="bytes").load()
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}


def read_cifar(folder: str, kind: str) -> tuple[dict[str, ArrayList], list[str]]:
    """The train and test batches of a CIFAR-10 / CIFAR-100 python folder as ArrayLists, and the class names."""
    if kind == "cifar10":
        meta, label_key, names_key = "batches.meta", "labels", "label_names"
        files = {"train": sorted(f for f in os.listdir(folder) if f.startswith("data_batch_")), "val": ["test_batch"]}
    else:
        meta, label_key, names_key = "meta", "fine_labels", "fine_label_names"
        files = {"train": ["train"], "val": ["test"]}
    classes = [n.decode() if isinstance(n, bytes) else n for n in unpickle(os.path.join(folder, meta))[names_key]]
    out = {}
    for split, names in files.items():
        images, labels, paths = [], [], []
        for name in names:
            d = unpickle(os.path.join(folder, name))
            data = np.asarray(d["data"], dtype=np.uint8)
            images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels += list(d[label_key])
            fnames = d.get("filenames") or [f"{name}_{i:05d}.png".encode() for i in range(len(data))]
            paths += [f"{split}/{(f.decode() if isinstance(f, bytes) else f)}" for f in fnames]
        out[split] = ArrayList(np.ascontiguousarray(np.concatenate(images)), labels, paths, classes)
    return out, classes


def source(cfg: DataConfig, img_size: int = 32) -> Source:
    """The train and test batches (``img_size``: unused, the images are 32²)."""
    folder, kind = cifar_root(resolve_path(cfg.source))
    pools, classes = read_cifar(folder, kind)
    return Source(NAME, folder, classes, cfg, pools)
