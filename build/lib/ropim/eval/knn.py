"""Cosine k-nearest-neighbour classification of frozen features (DINO's exp(sim / T) voting). Pure torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ropim.eval.metrics import topk_accuracy


def knn_scores(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, k: int = 20,
               temperature: float = 0.07, n_classes: int | None = None, chunk: int = 1024) -> torch.Tensor:
    """Class votes (V, K) of a cosine kNN: each of the k nearest train features votes exp(sim / T) for its label."""
    train_x, val_x = F.normalize(train_x.float(), dim=1), F.normalize(val_x.float(), dim=1)
    n_classes = n_classes or int(train_y.max()) + 1
    k = min(k, len(train_x))
    votes = []
    for i in range(0, len(val_x), chunk):
        sim, idx = (val_x[i:i + chunk] @ train_x.T).topk(k, dim=1)
        v = torch.zeros(len(sim), n_classes, device=sim.device)
        votes.append(v.scatter_add_(1, train_y.to(sim.device)[idx], (sim / temperature).exp()))
    return torch.cat(votes)


def knn_probe(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor, k: int = 20,
              temperature: float = 0.07, n_classes: int | None = None) -> dict[str, object]:
    """{'top1', 'top5' (%), 'scores' (V, K) votes} of the cosine kNN on ``val``."""
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    scores = knn_scores(train_x, train_y, val_x, k, temperature, n_classes).cpu()
    return {**topk_accuracy(scores, val_y), "scores": scores}


def knn_top1(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
             k: int = 20, temperature: float = 0.07) -> float:
    """Top-1 (%) of the cosine kNN on ``val``."""
    return knn_probe(train_x, train_y, val_x, val_y, k, temperature)["top1"]
