"""Ray Data ingest for Ray Train: a source → decoded, augmented, normalized batches on every worker.

Pipeline::

    read  ── Parquet: read_parquet(shards).select_columns(image, label[, path]), cut into 500-row blocks
          └─ ImageFolder / CIFAR / digits: from_arrow(blocks of file names or raw pixels)
    map_batches(decode + augment)  → {"image": uint8 (B, H, W, 3), "label": int64 (B,)}
    TorchTrainer(datasets={"train": ds})  → per worker ray.train.get_dataset_shard("train")
    iter_epoch(shard, batch_size, epoch, ...)  → (images normalized float32 (B, 3, H, W), labels) torch batches on
                                                the worker's device, drop_last=True

**Pixels travel as uint8.** The object store, the shuffle buffers and the copy to the GPU carry a quarter of
float32's bytes (a 224² image: 150,528 B, not 602,112 B; ImageNet-1k's epoch: 193 GB, not 771 GB); ``iter_epoch``
normalizes on the worker's device, with the same float32 arithmetic as ``ropim.data.augment.normalize``, so the
values are the ones the DataLoader path gives.

**Resources — the 2-CPU hang.** Ray Train reserves its workers' CPUs before Ray Data schedules anything.
With the default 1 CPU per worker, 2 workers on a 2-CPU machine leave no CPU for the read/decode tasks and the
job hangs ("Cluster resources are not enough to run any task … may hang forever"); Ray Data's
``resource_limits`` cannot fix it. Give the workers a fraction, at most
``ScalingConfig(num_workers=n, resources_per_worker={"CPU": ropim.checks.data_cpu_share(cpus, n)})`` — 0.5 for 2
workers on 2 CPUs, i.e. a CPU left to Ray Data (the rule ``ropim pretrain --ingest ray_data`` checks); or declare
more logical CPUs than train workers with ``ray.init(num_cpus=...)``. GPUs are added by ``use_gpu=True`` as usual.

**Shuffling, seeded per epoch.** (1) The order of the input is shuffled on every execution of the dataset,
i.e. every epoch: Parquet shard order with ``FileShuffleConfig(seed, reseed_after_execution=True)``, the
blocks of in-memory sources with ``randomize_block_order(RandomSeedConfig(seed, reseed_after_execution=True))``
(their items are also permuted once with ``seed`` before being cut into blocks). Ray derives each execution's
seed from ``seed`` and its execution index. (2) Rows are mixed within a local shuffle buffer on each worker,
seeded from (``seed``, ``epoch``, ``rank``) by ``iter_epoch`` — explicit, so a resumed run mixes its remaining
epochs' rows as the original would have; (1) is not: Ray counts a dataset's executions from 0 in each job, so a
resumed job's input order starts again at the first epoch's. Orders are reproducible up to Ray's streaming split,
which hands blocks to whichever worker asks first. Crop/flip randomness is fresh in every task (not seeded).

**Start-up.** Decode tasks import this module, ``ropim.sources`` and ``ropim.augment`` only — no torch —
because a fresh Ray worker importing torch + torchvision took 7–17 s here, paid again whenever Ray
recycles idle workers between epochs.

**Decode tasks** ask for ``DECODE_TASK_CPUS`` = 0.25 logical CPU each, so that enough run at once to keep a
small machine's cores busy between Ray Data's own operators (see the constant); pass ``num_cpus=1`` on large
nodes.

**Bad images.** The map step decodes every image; undecodable ones are dropped (``on_bad_image="skip"``, so a
batch may shrink — ``iter_torch_batches`` re-batches) and reported to an optional ``BadImageCounter`` actor
(``new_bad_image_counter()``; read it with ``bad_image_summary(counter)`` → distinct count + first 20 paths), or
fail the task with ``BadImageError`` naming the file (``fail``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import ray
import ray.data
from ray.data import FileShuffleConfig, RandomSeedConfig

from ropim.data import footers
from ropim.data.augment import PIXEL_INV_STD, PIXEL_MEAN, resize
from ropim.data.augment import augment as augment_image
from ropim.data.config import DataConfig
from ropim.data.decode import DEFAULT_MAX_PIXELS, BadImages, try_decode
from ropim.data.formats.common import in_val
from ropim.data.lists import ArrayList, FileList
from ropim.data.sources import open_source
from ropim.errors import ConfigError
from ropim.seeds import derived_seed

if TYPE_CHECKING:  # no torch at import time: decode workers import this module (see ropim.data.augment)
    import torch

# Logical CPUs per decode task. Ray Data keeps about one logical CPU to its other operators (read), so on
# 2 CPUs 1-CPU decode tasks run one at a time. Measured on 2 idle cores (CIFAR-10 Parquet, 32², batch 128,
# ray.init(num_cpus=2)): 0.5 → 5,589 img/s with the machine 83% busy; 0.25 → 8,190 img/s, 96% busy, as fast
# as a 2-worker torch DataLoader (8,044). On large nodes pass num_cpus=1 to keep one decode process per core.
DECODE_TASK_CPUS = 0.25
BLOCK_ROWS = 500  # rows per decode task's input block (Parquet: streaming repartition; others: from_arrow)


@ray.remote(num_cpus=0)
class BadImageCounter:
    """Distinct undecodable images reported by the map tasks of a dataset (all epochs)."""

    def __init__(self) -> None:
        self.paths: dict[str, None] = {}

    def add(self, paths: list[str]) -> None:
        self.paths.update(dict.fromkeys(paths))

    def summary(self, limit: int = 20) -> dict:
        return {"count": len(self.paths), "paths": list(self.paths)[:limit]}


def new_bad_image_counter():
    """A ``BadImageCounter`` actor handle (0 CPUs) to pass to ``build_ray_dataset(bad_images=...)``.

    It lives on the caller's node (the job's driver: a lost worker node does not take it along, and the restarted
    workers find it) and is restarted, empty, if that node goes anyway."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return BadImageCounter.options(scheduling_strategy=here, max_restarts=-1, max_task_retries=-1).remote()


def bad_image_summary(counter) -> dict:
    """{"count": distinct bad images so far, "paths": the first 20} — log ``count`` as a metric."""
    return ray.get(counter.summary.remote())


def decode_batch(batch: dict[str, np.ndarray], *, img_size: int, augment: bool, policy: str = "skip",
                 max_pixels: int = DEFAULT_MAX_PIXELS,
                 keep_val: bool | None = None, split_seed: int = 0, val_fraction: float = 0.2,
                 raw_shape: tuple[int, int, int] | None = None, counter=None) -> dict[str, np.ndarray]:
    """The map_batches step: select the split's rows (seeded fraction), decode, augment, normalize.

    Input columns: ``label`` and one of ``image`` (encoded bytes), ``file`` (a local file name) or ``raw``
    (``raw_shape`` uint8 pixels); optionally ``path`` (names bad images; the split key).
    """
    n = len(batch["label"])
    paths = list(batch["path"]) if "path" in batch else [None] * n
    if "image" in batch:
        def load(i):
            return batch["image"][i]
    elif "file" in batch:
        def load(i):
            try:
                with open(batch["file"][i], "rb") as f:
                    return f.read()
            except OSError:
                return None
    else:
        def load(i):
            return np.frombuffer(batch["raw"][i], dtype=np.uint8).reshape(raw_shape)
    rows = np.arange(n)
    if keep_val is not None:
        keys = [p if p is not None else bytes(load(i)) for i, p in enumerate(paths)]
        rows = rows[in_val(keys, split_seed, val_fraction) == keep_val]
    rng, bad, bad_paths = np.random.default_rng(), BadImages(policy, max_pixels), []
    images, labels = [], []
    for i in rows:
        name = paths[i] or (str(batch["file"][i]) if "file" in batch else f"row {i}")
        img = try_decode(load(i), name, bad)
        if img is None:
            bad_paths.append(name)
            continue
        images.append(augment_image(img, img_size, rng.random) if augment else resize(img, img_size))
        labels.append(batch["label"][i])
    if bad_paths and counter is not None:
        ray.get(counter.add.remote(bad_paths))  # rare; waiting keeps the count current for the reader
    out = np.stack(images) if images else np.zeros((0, img_size, img_size, 3), np.uint8)
    return {"image": out, "label": np.asarray(labels, dtype=np.int64)}


def _memory_blocks(images, shuffle_seed: int | None) -> list[pa.Table]:
    """An in-memory split as Arrow blocks of file names or raw pixels (permuted once when shuffling)."""
    order = np.arange(len(images)) if shuffle_seed is None else np.random.default_rng(shuffle_seed).permutation(
        len(images))
    cols = {"label": pa.array(images.labels[order]), "path": images.paths[order].array.cast(pa.string())}
    if isinstance(images, FileList):
        cols["file"] = pa.array([images.file(i) for i in order])
    elif isinstance(images, ArrayList):
        arr = np.ascontiguousarray(images.images[order])
        width = int(np.prod(arr.shape[1:]))
        cols["raw"] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(arr), [None, pa.py_buffer(arr)])
    else:
        raise TypeError(f"unexpected image list {type(images).__name__}")
    table = pa.table(cols)
    return [table.slice(i, BLOCK_ROWS) for i in range(0, len(table), BLOCK_ROWS)]


def build_ray_dataset(cfg: DataConfig, split: str, img_size: int = 32, *, augment: bool | None = None,
                      shuffle_seed: int | None = 0, bad_images=None, map_batch_size: int = 64,
                      num_cpus: float = DECODE_TASK_CPUS) -> ray.data.Dataset:
    """``split`` of the source as a Ray Dataset of {"image": uint8 (B, H, W, 3), "label": int64}.

    ``augment`` (default: split == "train") applies the paper's crop + flip (``ropim.augment``, the same as
    ``pretrain_transform``), else a resize as ``eval_transform``. ``shuffle_seed``: per-epoch seeded input
    order (None: source order, for eval).
    ``bad_images``: a ``new_bad_image_counter()`` handle to count skipped images. ``num_cpus``: logical CPUs
    per decode task (see ``DECODE_TASK_CPUS``). Needs Ray initialised (``ray.init`` or inside a Ray job);
    call ``cfg.validate()`` first for errors before Ray starts. Listing happens here, on the driver; images
    are read and decoded in Ray tasks.
    """
    if split not in ("train", "val"):
        raise ConfigError(f"split={split!r}: choose train or val")
    cfg = cfg.resolved()
    cfg.validate()
    augment = split == "train" if augment is None else augment
    src = open_source(cfg, img_size)
    kwargs = dict(img_size=img_size, augment=augment, policy=cfg.on_bad_image, max_pixels=cfg.max_pixels,
                  split_seed=cfg.split_seed,
                  val_fraction=cfg.val_fraction, counter=bad_images)
    if src.format == "parquet":
        files, kwargs["keep_val"] = src.shards(split)
        shuffle = None if shuffle_seed is None else FileShuffleConfig(seed=shuffle_seed, reseed_after_execution=True)
        has_path = "path" in footers.schema(src.fs, files[0]).names
        ds = ray.data.read_parquet(files, filesystem=src.fs, shuffle=shuffle)
        ds = ds.select_columns(["image", "label"] + (["path"] if has_path else []))
        # Ray 2.60 bin-packs small shards into one read unit of up to 128 MiB (one block): cut it into
        # BLOCK_ROWS-row blocks, streaming, so several decode tasks run in parallel.
        ds = ds.repartition(target_num_rows_per_block=BLOCK_ROWS)
    else:
        images = src.split(split)
        if isinstance(images, ArrayList):
            kwargs["raw_shape"] = tuple(images.images.shape[1:])
        ds = ray.data.from_arrow(_memory_blocks(images, shuffle_seed))
        if shuffle_seed is not None:
            ds = ds.randomize_block_order(seed=RandomSeedConfig(seed=shuffle_seed, reseed_after_execution=True))
    ds = ds.map_batches(decode_batch, batch_format="numpy", batch_size=map_batch_size, fn_kwargs=kwargs,
                        num_cpus=num_cpus)
    quiet(ds.context)
    # a decode task's own error, not Ray Data's UserCodeException around it: a bad image's BadImageError reaches the
    # job as itself (pickling Ray's task error drops the exception chain), so the job ends in its one line
    ds.context.raise_original_map_exception = True
    return ds


def quiet(context: ray.data.DataContext) -> None:
    """No progress bars and no execution notices from a dataset of this ``context`` (its own, which the executor
    copies): a job's driver output is its epoch lines, where the bars wrote 60-70 KB per 2-step epoch."""
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def iter_epoch(shard, batch_size: int, epoch: int, *, seed: int = 0, rank: int = 0,
               shuffle_buffer: int | None = None, device="auto") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of (images: normalized float32 (B, 3, H, W), labels) torch batches from
    ``ray.train.get_dataset_shard(...)`` (or any Dataset of ``build_ray_dataset``).

    ``drop_last=True``; rows mixed in a local buffer of ``shuffle_buffer`` rows (default 4 × batch_size,
    0 = off) seeded by ``ropim.seeds.derived_seed(seed, epoch, rank)``. ``device="auto"`` puts batches on the Train
    worker's device, where their uint8 pixels are normalized.
    """
    import torch

    buffer = 4 * batch_size if shuffle_buffer is None else shuffle_buffer
    batches = shard.iter_torch_batches(
        batch_size=batch_size, drop_last=True, device=device,
        dtypes={"image": torch.uint8, "label": torch.int64},
        local_shuffle_buffer_size=buffer or None,
        local_shuffle_seed=derived_seed(seed, epoch, rank) % 2**32 if buffer else None,
    )
    mean, inv_std = (torch.from_numpy(v).view(1, 3, 1, 1) for v in (PIXEL_MEAN, PIXEL_INV_STD))
    for batch in batches:
        pixels = batch["image"].permute(0, 3, 1, 2)  # uint8 (B, 3, H, W), a view
        if mean.device != pixels.device:  # once an epoch, not two host-to-device copies a batch
            mean, inv_std = mean.to(pixels.device), inv_std.to(pixels.device)
        yield ((pixels.float() - mean) * inv_std).contiguous(), batch["label"]
