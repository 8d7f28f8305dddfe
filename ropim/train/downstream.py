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

import torch

from ropim.checks import check_encoder_input
from ropim.console import Pace
from ropim.core.backbone import build_classifier, classifier_spec
from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset, eval_splits, eval_transform
from ropim.errors import ConfigError
from ropim.eval.features import Cancelled, extract_features
from ropim.eval.knn import knn_top1
from ropim.eval.metrics import per_class_accuracy
from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef
from ropim.train.job import dataset_name
from ropim.viz.confusion import confusion_png

log = logging.getLogger("ropim.downstream")


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
    if ref.version is None:
        return
    c = store.client(tracking)
    for k, v in tags.items():
        c.set_model_version_tag(ref.name, ref.version, k, f"{v:.2f}")
    registry.describe(ref.name, ref.version, tracking)


def run_tags(ref: EncoderRef, kind: str, data: DataConfig) -> dict[str, str]:
    """Tags of a downstream run: what it is, the encoder it started from, the data."""
    tags = {"ropim.kind": kind, "ropim.encoder_uri": ref.uri, "ropim.dataset": dataset_name(data)}
    if ref.version:
        tags |= {"ropim.encoder_name": ref.name, "ropim.encoder_version": ref.version}
    return tags


def frozen_scores(encoder: torch.nn.Module, img_size: int, data: DataConfig, knn_k: int = 20,
                  linear: bool = True, cancelled: Callable[[], bool] | None = None,
                  progress: str | None = None) -> dict[str, float]:
    """Top-1 (%) of frozen pooled features on the val split, the train split as memory bank / probe training set:
    ``knn_top1`` (cosine kNN, k = ``knn_k``) and, with ``linear``, ``linear_top1`` (ropim.eval.linear's probe).
    ``cancelled`` (asked before each batch and before the probe): True raises ``ropim.eval.features.Cancelled``.
    With ``progress`` (a line's start, e.g. ``[graft] epoch 5 kNN``), a long extraction says its progress
    (``ropim.console.Pace``)."""
    train_set, val_set = eval_splits(data, img_size)  # one listing of the source for both

    def features(split: str, dataset) -> tuple[torch.Tensor, torch.Tensor]:
        pace = Pace(f"{progress}, {split} features", len(dataset), log.info) if progress else None
        return extract_features(encoder, dataset, cancelled=cancelled, progress=pace)

    train_x, train_y = features("train", train_set)
    val_x, val_y = features("val", val_set)
    if cancelled is not None and cancelled():
        raise Cancelled("evaluation cancelled before its kNN and probe")
    scores = {"knn_top1": knn_top1(train_x, train_y, val_x, val_y, k=knn_k)}
    if linear:
        from ropim.eval.linear import linear_probe  # scikit-learn: loaded by the processes that probe, only

        scores["linear_top1"] = linear_probe(train_x, train_y, val_x, val_y)["top1"]
    return scores
