"""Ray Data ingest: every format decoded in Ray tasks, bad images counted or named."""

from __future__ import annotations

import numpy as np
import pytest
from sample_data import cifar10

from ropim.data.config import DataConfig


def test_ray_dataset_decodes_every_format_and_counts_bad_images(ray_session, folder, parquet_set, tmp_path):
    from ropim.data.ingest import bad_image_summary, build_ray_dataset, new_bad_image_counter

    root, rows = parquet_set
    batch = build_ray_dataset(DataConfig(str(root)), "val", 32, shuffle_seed=None).take_batch(100)
    assert batch["image"].shape == (10, 32, 32, 3) and batch["image"].dtype == np.uint8  # a quarter of float32's bytes
    assert sorted(batch["label"].tolist()) == sorted(r[1] for r in rows["val"])
    d, expect = cifar10(tmp_path)
    batch = build_ray_dataset(DataConfig(str(d)), "train", 32).take_batch(100)
    assert batch["image"].shape == (10, 32, 32, 3) and sorted(batch["label"]) == sorted(expect["train"][1])

    froot, good, broken = folder
    counter = new_bad_image_counter()
    cfg = DataConfig(str(froot), val_fraction=0.5, split_seed=1)
    n = sum(len(b["label"]) for s in ("train", "val")
            for b in build_ray_dataset(cfg, s, 16, bad_images=counter).iter_batches(batch_size=None))
    assert n == len(good) and bad_image_summary(counter) == {"count": 1, "paths": [broken]}
    fail = DataConfig(str(froot), val_fraction=0.5, split_seed=1, on_bad_image="fail")
    with pytest.raises(Exception, match="broken.jpg: cannot decode image"):  # fails fast: no retries
        for s in ("train", "val"):
            build_ray_dataset(fail, s, 16).take_all()


def test_the_workers_batches_are_normalized_as_the_dataloader_path_normalizes(ray_session, parquet_set):
    """uint8 pixels through Ray Data, normalized on the worker's device by ``iter_epoch``: the very values of
    ``ropim.data.augment.normalize``, which the DataLoader path's transforms apply."""
    import torch

    from ropim.data.augment import normalize
    from ropim.data.ingest import build_ray_dataset, iter_epoch

    root, _ = parquet_set
    ds = build_ray_dataset(DataConfig(str(root)), "val", 32, shuffle_seed=None)
    pixels = ds.take_batch(100)
    (images, labels), = list(iter_epoch(ds, 10, 0, shuffle_buffer=0, device="cpu"))
    assert images.dtype == torch.float32 and images.shape == (10, 3, 32, 32) and images.is_contiguous()
    assert torch.equal(images, torch.from_numpy(normalize(pixels["image"])))  # bit for bit
    assert labels.tolist() == pixels["label"].tolist()
