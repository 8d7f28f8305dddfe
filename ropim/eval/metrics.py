"""Classification scores: top-k accuracy (timm), confusion matrices and per-class recall (scikit-learn, imported
by the confusion matrix only: kNN and top-k run in processes that never load it)."""

from __future__ import annotations

import numpy as np
import torch
from timm.utils import accuracy


def topk_hits(scores: torch.Tensor, target: torch.Tensor, k: int = 5) -> tuple[int, int]:
    """(top-1 hits, top-k hits) of class scores (N, K) against labels (N,)."""
    top1, topk = accuracy(scores.float(), target.to(scores.device), topk=(1, min(k, scores.shape[1])))
    n = len(target)
    return round(top1.item() * n / 100), round(topk.item() * n / 100)


def topk_accuracy(scores: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%) of class scores (N, K)."""
    h1, h5 = topk_hits(scores, target)
    return {"top1": 100 * h1 / len(target), "top5": 100 * h5 / len(target)}


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(K, K) int64 counts, rows = true class, columns = predicted class."""
    from sklearn.metrics import confusion_matrix as sk_confusion_matrix

    counts = sk_confusion_matrix(target.cpu().numpy(), pred.cpu().numpy(), labels=np.arange(n_classes))
    return torch.as_tensor(counts, dtype=torch.int64)


def per_class_accuracy(confusion: torch.Tensor) -> list[float]:
    """Recall (%) of each class; NaN for classes absent from the split."""
    conf = torch.as_tensor(confusion, dtype=torch.float64)
    return (100 * conf.diag() / conf.sum(1)).tolist()
