"""Segmentation scores and inference, pure torch: the pixel confusion matrix (summed over images and workers), the
mmseg metrics computed from it, and whole-image or sliding-window logits of a segmenter.

Metrics (as mmseg's ``IoUMetric``): per-class IoU = TP / (TP + FP + FN) over all evaluated pixels; a class that is
neither in the ground truth nor predicted has no IoU (NaN) and is left out of the mean; mIoU = mean over the classes
present (in the ground truth or the prediction); pixel accuracy (aAcc) = correct / labelled pixels. Pixels labelled
``ignore_index`` count nowhere.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = 255


def pixel_confusion(pred: torch.Tensor, target: torch.Tensor, num_classes: int,
                    ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """(K, K) int64 pixel counts, rows = true class, columns = predicted class, of label maps of any equal shape."""
    keep = target != ignore_index
    t, p = target[keep].long(), pred[keep].long()
    return torch.bincount(t * num_classes + p, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def segmentation_scores(confusion: torch.Tensor) -> dict:
    """``miou`` and ``pixel_acc`` (%), ``per_class_iou`` (%, NaN for a class absent from both) of a confusion matrix."""
    conf = torch.as_tensor(confusion, dtype=torch.float64)
    tp = conf.diag()
    union = conf.sum(0) + conf.sum(1) - tp  # predicted + labelled − both
    iou = torch.where(union > 0, tp / union.clamp(min=1), torch.full_like(tp, float("nan")))
    labelled = conf.sum()
    return {"miou": 100 * iou.nanmean().item() if (union > 0).any() else float("nan"),
            "pixel_acc": 100 * (tp.sum() / labelled).item() if labelled > 0 else float("nan"),
            "per_class_iou": (100 * iou).tolist()}


def window_starts(size: int, crop: int, stride: int) -> list[int]:
    """Window origins along one axis covering ``size`` with windows of ``crop`` every ``stride`` (the last flush with
    the end), as mmseg's slide inference; [0] when the axis fits in one window."""
    if size <= crop:
        return [0]
    starts = list(range(0, size - crop, stride))
    return starts + [size - crop]


@torch.no_grad()
def slide_logits(model: torch.nn.Module, image: torch.Tensor, crop: int, stride: int, num_classes: int,
                 batch: int = 8) -> torch.Tensor:
    """Logits (K, H, W) of one normalized image (3, H, W) with H, W ≥ ``crop`` (pad smaller ones first): windows of
    ``crop`` every ``stride``, each window's logits upsampled to the window and averaged where windows overlap."""
    _, h, w = image.shape
    boxes = [(y, x) for y in window_starts(h, crop, stride) for x in window_starts(w, crop, stride)]
    out = image.new_zeros(num_classes, h, w)
    count = image.new_zeros(1, h, w)
    for i in range(0, len(boxes), batch):
        part = boxes[i:i + batch]
        crops = torch.stack([image[:, y:y + crop, x:x + crop] for y, x in part])  # (n, 3, crop, crop)
        logits = F.interpolate(model(crops).float(), size=(crop, crop), mode="bilinear", align_corners=False)
        for (y, x), lg in zip(part, logits, strict=True):
            out[:, y:y + crop, x:x + crop] += lg
            count[:, y:y + crop, x:x + crop] += 1
    return out / count


@torch.no_grad()
def predict_logits(model: torch.nn.Module, image: torch.Tensor, crop: int, num_classes: int, mode: str = "slide",
                   stride: int | None = None, out_size: tuple[int, int] | None = None) -> torch.Tensor:
    """Logits (K, *out_size) of one normalized image (3, H, W) in eval mode: ``whole`` resizes it to crop × crop,
    ``slide`` pads it to at least the crop (zeros, cut off again) and slides windows (default stride: 2/3 crop)."""
    _, h, w = image.shape
    out_size = out_size or (h, w)
    if mode == "whole":
        x = F.interpolate(image[None], size=(crop, crop), mode="bilinear", align_corners=False)
        logits = model(x).float()  # (1, K, h', w')
    else:
        padded = F.pad(image, (0, max(0, crop - w), 0, max(0, crop - h)))
        logits = slide_logits(model, padded, crop, stride or max(1, crop * 2 // 3), num_classes)[None, :, :h, :w]
    return F.interpolate(logits, size=out_size, mode="bilinear", align_corners=False)[0]
