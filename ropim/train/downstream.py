"""What the jobs and flows that start from an encoder share (fine-tune, graft, segment, probe, transfer): checking an
encoder against the data, the classifier's registry config, the final evaluation a checkpoint holds, logging per-class
results to MLflow, the run's tags, and tagging the encoder version with its downstream score."""

from __future__ import annotations

import json
import logging
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Subset

from ropim.checks import check_encoder_input
from ropim.console import Pace
from ropim.core.backbone import build_classifier, classifier_spec
from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset, eval_splits, eval_transform
from ropim.data.sampling import contiguous_share, dealt, sample
from ropim.errors import ConfigError
from ropim.eval.features import Cancelled, extract_features
from ropim.eval.knn import knn_neighbours, knn_votes, nearest
from ropim.eval.metrics import per_class_accuracy, topk_accuracy
from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef
from ropim.train.job import dataset_name
from ropim.viz.confusion import confusion_png

if TYPE_CHECKING:
    from ropim.train.task import Worker

log = logging.getLogger("ropim.downstream")
GPU_BANK = 300_000  # train images whose features one worker's kNN holds on its GPU (~1.8 GB at ViT-B's 768 wide)


def eval_split(ref: EncoderRef, data: DataConfig, img_size: int, split: str = "val"):
    """``split`` of ``data`` under the eval transform, after checking the encoder's input (RGB, ``img_size`` a
    multiple of its patch size) and that the split holds images."""
    check_encoder_input(ref.uri, ref.config, img_size)
    dataset = build_dataset(data, split, eval_transform(img_size), img_size)
    if len(dataset) == 0:
        raise ConfigError(f"data source={data.source!r}: the split holds no images")
    return dataset


def classifier_from(config: dict, state: dict[str, torch.Tensor] | None, num_classes: int, img_size: int | None = None,
                    drop_path: float = 0.0, uri: str = "encoder", quiet: bool = False) -> torch.nn.Module:
    """The timm classifier (``num_classes`` 0: pooled features) of an encoder's config and weights at ``img_size``,
    built the BEiT/SimMIM way (``ropim.core.backbone.build_classifier``); a resampling is logged once."""
    clf = build_classifier(config["arch"], config["timm_kwargs"], state, num_classes, img_size, drop_path,
                           source=f"encoder {uri}")
    if not quiet and len(clf.actions) > 1:
        log.info(f"[downstream] encoder {uri}: {clf.summary()}")
    return clf.model


def classifier_config(ref: EncoderRef, classes: list[str], img_size: int, dataset: str, metrics: dict) -> dict:
    """The JSON config stored beside a registered classifier (scalar entries become version tags)."""
    name, kwargs = classifier_spec(ref.config["arch"], ref.config["timm_kwargs"], len(classes), img_size)
    return {
        "arch": name, "timm_kwargs": kwargs, "img_size": img_size,
        "patch_size": ref.config["patch_size"], "num_classes": len(classes), "classes": list(classes),
        "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "dataset": dataset,
        "encoder_uri": ref.pinned, "encoder_name": ref.name or "", "encoder_version": ref.version or "",
        "top1": round(metrics["top1"], 4), "top5": round(metrics["top5"], 4), "embed_dim": ref.config.get("embed_dim"),
    }


def log_results(run_id: str, confusion, classes: list[str], tracking: str, *, prefix: str = "", step: int | None = None,
                title: str = "") -> dict:
    """Log per-class accuracy metrics (``<prefix>class_acc.<class>``), ``<prefix>confusion.png`` and
    ``<prefix>confusion.json`` (matrix, classes, per-class accuracy) on ``run_id``; return the JSON."""
    conf = torch.as_tensor(confusion)
    per_class = per_class_accuracy(conf)
    safe = [re.sub(r"[^A-Za-z0-9_\-. /]", "_", c) or "_" for c in classes]
    metrics = {f"{prefix}class_acc.{c}": a for c, a in zip(safe, per_class, strict=True) if a == a}
    items = list(metrics.items())
    for i in range(0, len(items), 900):  # MLflow takes at most 1000 metrics per batch
        store.log_metrics(run_id, dict(items[i:i + 900]), step or 0, tracking)
    report = {"classes": list(classes), "confusion": conf.tolist(), "per_class_top1": per_class}
    c = store.client(tracking)
    with tempfile.TemporaryDirectory() as tmp:
        confusion_png(conf, list(classes), Path(tmp, f"{prefix}confusion.png"), title or f"{prefix}confusion")
        Path(tmp, f"{prefix}confusion.json").write_text(json.dumps(report))
        c.log_artifact(run_id, str(Path(tmp, f"{prefix}confusion.png")))
        c.log_artifact(run_id, str(Path(tmp, f"{prefix}confusion.json")))
    return report


def final_eval(folder: Path) -> dict:
    """The final evaluation a fine-tune's or segmentation's last checkpoint holds (its ``metrics.json``)."""
    return json.loads((folder / "metrics.json").read_text())["eval"]


def tag_version(ref: EncoderRef, tags: dict[str, float], tracking: str) -> None:
    """Write ``tags`` (e.g. ``downstream.digits.top1``) on the encoder's registered version, if it has one."""
    if ref.version is not None:
        registry.tag_scores(ref.name, ref.version, tags, tracking)


def run_tags(ref: EncoderRef, kind: str, data: DataConfig) -> dict[str, str]:
    """Tags of a downstream run: what it is, the encoder it started from, the data."""
    tags = {"ropim.kind": kind, "ropim.encoder_uri": ref.uri, "ropim.dataset": dataset_name(data)}
    if ref.version:
        tags |= {"ropim.encoder_name": ref.name, "ropim.encoder_version": ref.version}
    return tags


def frozen_scores(encoder: torch.nn.Module, img_size: int, data: DataConfig, knn_k: int = 20,
                  linear: bool = True, cancelled: Callable[[], bool] | None = None,
                  progress: str | None = None, worker: Worker | None = None, processes: int = 0,
                  train_images: int | None = None) -> dict[str, float]:
    """Top-1 (%) of frozen pooled features on the val split, the train split as memory bank / probe training set:
    ``knn_top1`` (cosine kNN, k = ``knn_k``) and, with ``linear``, ``linear_top1`` (ropim.eval.linear's probe).
    ``train_images``: the bank is a sample of that many train images (``ropim.data.sampling.sample``, seed 0: the
    same at every evaluation and in every run on the same data); None: the whole train split.
    ``cancelled`` (asked before each batch and before the probe): True raises ``ropim.eval.features.Cancelled``.
    With ``progress`` (a line's start, e.g. ``[graft] epoch 5 kNN``), a long extraction says its progress
    (``ropim.console.Pace``). With ``worker`` (every worker of a job calls it at once), each worker extracts a
    contiguous world-th of both splits (a Parquet shard is read by one worker) and the workers join their kNN
    candidates (and the probe's train features, on rank 0 alone): the same scores in a world-th of the time,
    returned by rank 0 (the others return ``{}``).
    ``processes`` DataLoader processes decode the images (the job's ``dataloader_workers``; 0: this process)."""
    split_over = worker if worker is not None and worker.world > 1 else None
    rank, world = (worker.rank, worker.world) if split_over else (0, 1)
    train_set, val_set = eval_splits(data, img_size)  # one listing of the source for both
    if train_images is not None and train_images < len(train_set):
        train_set = Subset(train_set, sample(len(train_set), train_images).tolist())

    def features(split: str, dataset) -> tuple[torch.Tensor, torch.Tensor]:
        share = Subset(dataset, contiguous_share(len(dataset), rank, world)) if split_over else dataset
        what = f"{progress}, {split} features" + (" (rank 0's share)" if split_over else "")
        pace = Pace(what, len(share), log.info) if progress and rank == 0 else None
        batch = 256  # each process reads its own part: dealt in the extraction's batches
        return extract_features(encoder, share, batch, num_workers=processes, cancelled=cancelled, progress=pace,
                                order=dealt(len(share), batch, processes))

    train_x, train_y = features("train", train_set)
    val_x, val_y = features("val", val_set)
    if cancelled is not None and cancelled():
        raise Cancelled("evaluation cancelled before its kNN and probe")
    if split_over:
        val_x, val_y = joined(split_over, val_x, len(val_set)), joined(split_over, val_y, len(val_set))
    # a worker's device (every worker evaluates at once, nothing trains meanwhile): its share's similarities there,
    # one worker's whole bank up to GPU_BANK images (twice its features in GPU memory while normalized); an
    # evaluation beside training (no ``worker``) leaves the GPU to training
    near = worker is not None and (split_over is not None or len(train_set) <= GPU_BANK)
    on = worker.device if near else torch.device("cpu")
    sim, labels = knn_neighbours(train_x.to(on), train_y, val_x.to(on), knn_k)  # this worker's share of the bank
    if split_over:  # every share's candidates (world, V, k) -> the k nearest of them all
        sim, labels = (split_over.gather(t).permute(1, 0, 2).flatten(1) for t in (sim, labels))
        sim, labels = nearest(sim, labels, min(knn_k, len(train_set)))
        if linear:  # the probe is fitted on all the train features, on rank 0: the others never hold them
            train_x, train_y = (joined(split_over, t, len(train_set), first=True) for t in (train_x, train_y))
        if rank != 0:
            return {}
    n_classes = int(max(labels.max(), val_y.max())) + 1
    scores = {"knn_top1": topk_accuracy(knn_votes(sim, labels, n_classes).cpu(), val_y)["top1"]}
    if linear:
        from ropim.eval.linear import linear_probe  # scikit-learn: loaded by the processes that probe, only

        scores["linear_top1"] = linear_probe(train_x, train_y, val_x, val_y)["top1"]
    return scores


def joined(worker: Worker, share: torch.Tensor, total: int, rows: int = 16384,
           first: bool = False) -> torch.Tensor | None:
    """Every worker's share (rank r: ``contiguous_share(total, r, world)``) of ``total`` items, joined in their
    order on every worker (``first``: on rank 0 alone, the others get None), on CPU; gathered ``rows`` per worker
    at a time, so that no device holds world × a share at once."""
    world, gather = worker.world, worker.gather_to_first if first else worker.gather
    per = -(-total // world)  # the largest share; smaller ones are padded to it
    padded = torch.cat([share, share.new_zeros(per - len(share), *share.shape[1:])])
    parts = [gather(padded[i:i + rows]) for i in range(0, per, rows)]  # each (world, ≤ rows, …), or None
    if parts[0] is None:
        return None
    every = torch.cat(parts, dim=1)  # (world, per, …)
    return torch.cat([every[r, :len(contiguous_share(total, r, world))] for r in range(world)])
