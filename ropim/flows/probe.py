"""``ropim probe``: a linear probe and a cosine kNN of a frozen encoder on one data set.

Pooled features are extracted once (optionally cached on disk, keyed by the weights, the data and the size), then
scored by ``ropim.eval``; top-1 / top-5, per-class accuracy and confusion matrices go to MLflow (experiment
``ropim-probe``), and the encoder version is tagged ``downstream.<dataset>.linear_top1`` / ``.knn_top1``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import Dataset

from ropim.checks import check_encoder_input, check_knn_bank
from ropim.console import Pace, ensure_logging
from ropim.data.config import DataConfig
from ropim.data.datasets import ImageArrayDataset, ImageListDataset, eval_splits
from ropim.data.sampling import dealt
from ropim.eval.features import extract_features
from ropim.eval.knn import knn_probe
from ropim.eval.linear import linear_probe
from ropim.eval.metrics import confusion_matrix
from ropim.files import written_whole
from ropim.flows.config import ProbeConfig
from ropim.tracking import store
from ropim.tracking.encoders import EncoderRef, resolve_encoder
from ropim.tracking.names import default_run_name
from ropim.tracking.runs import open_run
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.downstream import classifier_from, log_results, run_tags, tag_version
from ropim.train.job import dataset_name
from ropim.train.runtime import gpu_or_cpu

log = logging.getLogger("ropim.probe")


def cache_key(state: dict[str, torch.Tensor], data: DataConfig, img_size: int,
              splits: list[ImageArrayDataset | ImageListDataset]) -> str:
    """The features' cache key: the encoder's weights, the data config and size, and what each split holds
    (the datasets' ``fingerprint``), so that changed, added or removed images are extracted again."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(json.dumps({"data": asdict(data), "img_size": img_size}, sort_keys=True).encode())
    for ds in splits:
        h.update(ds.fingerprint())
    return h.hexdigest()[:20]


def probe_splits(ref: EncoderRef, data: DataConfig, img_size: int, knn_k: int,
                 field: str = "knn_k") -> tuple[Dataset, Dataset]:
    """(train, val) under the eval transform, from one listing of the source, after checking the encoder's input
    (RGB, ``img_size`` a multiple of its patch size); ConfigError when a split holds no image or fewer train images
    than ``knn_k`` (the option ``field``)."""
    check_encoder_input(ref.uri, ref.config, img_size)
    train, val = eval_splits(data, img_size)
    check_knn_bank(knn_k, len(train), f"the train split of {data.source!r}", field)
    return train, val


def cached_features(encoder: nn.Module, state: dict[str, torch.Tensor], data: DataConfig, img_size: int,
                    train_set: Dataset, val_set: Dataset, cfg: ProbeConfig,
                    device: torch.device) -> dict[str, torch.Tensor]:
    """{'train_x', 'train_y', 'val_x', 'val_y'}: extracted once, read back from ``cfg.cache_dir`` when there."""
    path = None
    if cfg.cache_dir:
        key = cache_key(state, data, img_size, [train_set, val_set])
        path = Path(cfg.cache_dir, f"features-{key}.safetensors")
    if path is not None and path.exists():
        log.info(f"[probe] features from cache {path}")
        return load_file(str(path))
    encoder = encoder.to(device)
    t0 = time.perf_counter()
    feats = {}
    for split, ds in (("train", train_set), ("val", val_set)):
        feats[f"{split}_x"], feats[f"{split}_y"] = extract_features(
            encoder, ds, cfg.batch_size, device, cfg.dataloader_workers,
            progress=Pace(f"[probe] {split} features", len(ds), log.info),
            order=dealt(len(ds), cfg.batch_size, cfg.dataloader_workers))  # each process reads its own part
    n = len(feats["train_x"]) + len(feats["val_x"])
    log.info(f"[probe] features of {n} images in {time.perf_counter() - t0:.1f} s "
             f"({n / (time.perf_counter() - t0):.0f} img/s)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with written_whole(path) as tmp:  # two probes of one encoder and data set may write it at once
            save_file({k: v.contiguous() for k, v in feats.items()}, str(tmp))
    return feats


def probe(cfg: ProbeConfig) -> dict[str, object]:
    """Linear probe and kNN of ``cfg.encoder`` on ``cfg.data``; log to MLflow, tag the encoder version.

    Returns {'linear': {'top1', 'top5'}, 'knn': {'top1', 'top5'}, 'top1', 'top5' (the linear probe's), 'run_id'}.
    """
    ensure_logging()
    cfg = cfg.resolved().validate()
    tracking = tracking_uri()
    check_tracking(tracking)
    ref, state = resolve_encoder(cfg.encoder, tracking)
    data = cfg.data.resolved()
    img_size = cfg.img_size or ref.config["img_size"]
    train_set, val_set = probe_splits(ref, data, img_size, cfg.knn_k)
    classes = list(val_set.classes)
    device = gpu_or_cpu(cfg.use_gpu)
    torch.manual_seed(cfg.seed)
    encoder = classifier_from(ref.config, state, 0, img_size, uri=ref.uri)

    name = dataset_name(data)
    run_name = cfg.run_name or default_run_name(f"probe-{name}")
    params = {**cfg.to_dict(), "encoder": ref.pinned}
    with open_run(experiment=cfg.experiment, name=run_name, config=params, tags=run_tags(ref, "probe", data),
                  uri=tracking) as run:
        run_id = run.run_id
        f = cached_features(encoder, state, data, img_size, train_set, val_set, cfg, device)
        n_classes = len(classes)
        lin = linear_probe(f["train_x"], f["train_y"], f["val_x"], f["val_y"], c=cfg.linear_c,
                           max_iter=cfg.linear_max_iter, n_classes=n_classes, threads=cfg.linear_threads)
        knn = knn_probe(f["train_x"].to(device), f["train_y"], f["val_x"].to(device), f["val_y"], cfg.knn_k,
                        cfg.knn_temperature, n_classes)
        results = {}
        for method, res in (("linear", lin), ("knn", knn)):
            scores = res.pop("scores")
            store.log_metrics(run_id, {f"{method}_top1": res["top1"], f"{method}_top5": res["top5"]}, 0, tracking)
            conf = confusion_matrix(scores.argmax(1), f["val_y"], n_classes)
            log_results(run_id, conf, classes, tracking, prefix=f"{method}_",
                        title=f"{method} probe of {ref.label} on {name}: top-1 {res['top1']:.2f}%")
            results[method] = res
        tag_version(ref, {f"downstream.{name}.linear_top1": lin["top1"],
                          f"downstream.{name}.knn_top1": knn["top1"]}, tracking)
    print(f"[probe] {ref.label} on {name}: linear top-1 {lin['top1']:.2f}% top-5 {lin['top5']:.2f}%  |  "
          f"kNN (k={cfg.knn_k}) top-1 {knn['top1']:.2f}% top-5 {knn['top5']:.2f}%", flush=True)
    return {**results, "top1": lin["top1"], "top5": lin["top5"], "run_id": run_id}
