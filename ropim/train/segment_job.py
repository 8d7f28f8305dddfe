"""``ropim segment``: check the encoder against the data, open the run, train ``SegmentTask`` on the one loop (Ray
Train workers, or this process), then log per-class IoU and a picture, register the segmenter and tag the encoder
version with its mIoU."""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from ropim.console import ensure_logging
from ropim.core.upernet import build_segmenter
from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.seg_datasets import build_seg_dataset, seg_eval_transform
from ropim.data.seg_sources import open_seg_source
from ropim.errors import ConfigError
from ropim.eval.segmentation import predict_logits
from ropim.tracking import store
from ropim.tracking.encoders import EncoderRef, resolve_encoder
from ropim.tracking.names import default_run_name
from ropim.tracking.segmenters import register_segmenter
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.downstream import dataset_name, tag_version, train_downstream
from ropim.train.runtime import WorkerFn
from ropim.train.segment import worker_main
from ropim.train.segment_config import SegmentConfig
from ropim.viz.segmentation import segmentation_png

log = logging.getLogger("ropim.segment")


def baseline(cfg: SegmentConfig) -> SegmentConfig:
    """The same segmentation from a randomly initialised encoder of the same architecture."""
    return dataclasses.replace(cfg, random_init=True)


def prepare(cfg: SegmentConfig, tracking: str) -> tuple[SegmentConfig, EncoderRef]:
    """Resolve paths, validate ``cfg``, check the encoder and the training split, before any run starts; pin the
    encoder."""
    cfg = cfg.resolved().validate()
    cfg.check_resources()
    ref, _ = resolve_encoder(cfg.encoder, tracking)
    cfg.check_encoder(ref.uri, ref.config)
    n = len(open_seg_source(cfg.data).splits["train"])
    if n < cfg.batch_size:
        raise ConfigError(f"batch_size={cfg.batch_size} exceeds the training split ({n} pairs)")
    run_name = cfg.run_name or default_run_name(f"{cfg.kind}-{dataset_name(cfg.data)}")
    return dataclasses.replace(cfg, encoder=ref.pinned, run_name=run_name), ref


def square(t: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """A (C, H, W) map resized to (C, size, size) for a picture's row."""
    return torch.nn.functional.interpolate(t[None].float(), size=(size, size), mode=mode)[0]


def log_picture(cfg: SegmentConfig, run_id: str, model: torch.nn.Module, classes: list[str], tracking: str,
                title: str) -> str | None:
    """image | ground truth | prediction of the first ``viz_images`` val pairs, as ``segmentation.png``."""
    if not cfg.viz_images:
        return None
    val = build_seg_dataset(cfg.data, "val", seg_eval_transform(cfg.crop_size))
    images, truths, preds = [], [], []
    for i in range(min(cfg.viz_images, len(val))):
        image, mask = val[i]
        pred = predict_logits(model, image, cfg.crop_size, len(classes), cfg.eval_mode, cfg.eval_stride,
                              out_size=tuple(mask.shape)).argmax(0)
        images.append(square(image, cfg.crop_size, "bilinear"))
        truths.append(square(mask[None], cfg.crop_size, "nearest")[0].long())
        preds.append(square(pred[None], cfg.crop_size, "nearest")[0].long())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "segmentation.png"
        segmentation_png(torch.stack(images), torch.stack(truths), torch.stack(preds), classes, path, title)
        store.log_artifact(run_id, path, uri=tracking)
    return "segmentation.png"


def register_result(cfg: SegmentConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> dict:
    """Log the final scores, per-class IoU (JSON) and the picture; register the segmenter; tag the encoder."""
    name = dataset_name(cfg.data)
    ev = json.loads((folder / "metrics.json").read_text())["eval"]
    store.log_metrics(run_id, {"final_miou": ev["miou"], "final_pixel_acc": ev["pixel_acc"]}, ev["epoch"], tracking)
    per_class = dict(zip(ev["classes"], ev["per_class_iou"], strict=True))
    store.log_text(run_id, json.dumps({"classes": ev["classes"], "per_class_iou": ev["per_class_iou"],
                                       "miou": ev["miou"], "pixel_acc": ev["pixel_acc"]}, indent=2),
                   "per_class_iou.json", tracking)
    state = load_file(str(folder / "model.safetensors"))
    model = build_segmenter(ev["segmenter"])
    model.load_state_dict(state)
    picture = log_picture(cfg, run_id, model.eval(), ev["classes"], tracking,
                          f"{cfg.kind} of {ref.label} on {name}: mIoU {ev['miou']:.2f}%")
    out = {"per_class_iou": per_class, "segmenter_uri": None, "picture": picture}
    if cfg.registered_model and not cfg.random_init:
        config = {**ev["segmenter"], "classes": ev["classes"], "img_size": cfg.crop_size, "dataset": name,
                  "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "encoder_uri": ref.pinned,
                  "encoder_name": ref.name or "", "encoder_version": ref.version or "",
                  "backbone": ref.config.get("backbone", ""), "miou": round(ev["miou"], 4),
                  "pixel_acc": round(ev["pixel_acc"], 4)}
        uri = register_segmenter(run_id, state, config, cfg.registered_model, tracking)
        store.set_tags(run_id, {"ropim.segmenter_uri": uri}, tracking)
        print(f"[{cfg.kind}] registered segmenter {uri}", flush=True)
        out["segmenter_uri"] = uri
    if not cfg.random_init:
        tag_version(ref, {f"downstream.{name}.miou": ev["miou"]}, tracking)
    return out


def segment(cfg: SegmentConfig, *, worker_fn: WorkerFn = worker_main) -> dict[str, object]:
    """Train UperNet from ``cfg.encoder`` (or its architecture at random init); return val metrics: 'miou',
    'pixel_acc', 'train_loss', 'epoch', 'run_id', 'segmenter_uri', 'per_class_iou'."""
    ensure_logging()
    tracking = tracking_uri()
    check_tracking(tracking)
    cfg, ref = prepare(cfg, tracking)
    return train_downstream(cfg, ref, tracking, worker_fn, resumable=SegmentConfig.RESUMABLE,
                            config_artifact="config/segment.json", metric="miou", model_key="segmenter_uri",
                            size=f"{cfg.crop_size}px crops",
                            register=lambda run_id, folder: register_result(cfg, ref, run_id, folder, tracking))
