"""What a segmentation leaves: the final checkpoint's scores, per-class IoU and a picture in MLflow, the encoder
version tagged with ``downstream.<dataset>.miou`` (``log_segment_results``, the job's results function), the
segmenter registered (``register_segmenter``, the job's register function: ``ropim-segmenter``, loaded without
pickle)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from ropim.core.upernet import build_segmenter
from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD
from ropim.data.seg_datasets import build_seg_dataset, seg_eval_transform
from ropim.eval.segmentation import predict_logits
from ropim.tracking import store
from ropim.tracking.encoders import EncoderRef
from ropim.tracking.segmenters import register_segmenter as register_segmenter_files
from ropim.train.downstream import final_eval, tag_version
from ropim.train.job import dataset_name
from ropim.train.segment.config import SegmentConfig
from ropim.viz.segmentation import segmentation_png


def square(t: torch.Tensor, size: int, mode: str) -> torch.Tensor:
    """A (C, H, W) map resized to (C, size, size) for a picture's row."""
    return torch.nn.functional.interpolate(t[None].float(), size=(size, size), mode=mode)[0]


def log_picture(cfg: SegmentConfig, run_id: str, model: torch.nn.Module, classes: list[str], tracking: str,
                title: str) -> None:
    """image | ground truth | prediction of the first ``viz_images`` val pairs, as ``segmentation.png``."""
    if not cfg.viz_images:
        return
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


def log_segment_results(cfg: SegmentConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> None:
    """The job's results function (``ropim.train.jobs``): the final scores, per-class IoU (JSON) and the picture of
    the final checkpoint ``folder``, and the encoder version tagged with the mIoU (unless the encoder was not
    loaded)."""
    name, ev = dataset_name(cfg.data), final_eval(folder)
    store.log_metrics(run_id, {"final_miou": ev["miou"], "final_pixel_acc": ev["pixel_acc"]}, ev["epoch"], tracking)
    store.log_text(run_id, json.dumps({"classes": ev["classes"], "per_class_iou": ev["per_class_iou"],
                                       "miou": ev["miou"], "pixel_acc": ev["pixel_acc"]}, indent=2),
                   "per_class_iou.json", tracking)
    state = load_file(str(folder / "model.safetensors"))
    model = build_segmenter(ev["segmenter"])
    model.load_state_dict(state)
    log_picture(cfg, run_id, model.eval(), ev["classes"], tracking,
                f"{cfg.kind} of {ref.label} on {name}: mIoU {ev['miou']:.2f}%")
    if not cfg.random_init:
        tag_version(ref, {f"downstream.{name}.miou": ev["miou"]}, tracking)


def register_segmenter(cfg: SegmentConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> str | None:
    """The job's register function (``ropim.train.jobs``): the segmenter of the final checkpoint ``folder`` as a new
    version of ``registered_model``, or None when the encoder was not loaded (random init)."""
    if cfg.random_init:
        return None
    ev = final_eval(folder)
    config = {**ev["segmenter"], "classes": ev["classes"], "img_size": cfg.crop_size, "dataset": dataset_name(cfg.data),
              "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "encoder_uri": ref.pinned,
              "encoder_name": ref.name or "", "encoder_version": ref.version or "",
              "backbone": ref.config.get("backbone", ""), "miou": round(ev["miou"], 4),
              "pixel_acc": round(ev["pixel_acc"], 4)}
    return register_segmenter_files(run_id, load_file(str(folder / "model.safetensors")), config,
                                    cfg.registered_model, tracking)
