"""Cosine k-nearest-neighbour classification of frozen features (DINO's exp(sim / T) voting). Pure torch.

The train features may be split over several processes: each finds the k nearest of its share
(``knn_neighbours``), the candidates of all shares are joined, ``nearest`` keeps the k nearest of them, and
``knn_votes`` counts them; one process holding every train feature gives the same votes (``knn_scores``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ropim.eval.metrics import topk_accuracy


def knn_neighbours(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, k: int = 20,
                   chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarities (V, k) of each val feature's k nearest train features, most similar first, and their
    labels (V, k); fewer than k train features: the missing ones at similarity −inf, label 0. ``chunk`` val rows at
    a time (None: up to 1,024, at most 2²⁸ similarities, 1 GiB, whatever the bank: 209 rows at ImageNet-1k's)."""
    train_x, val_x = F.normalize(train_x.float(), dim=1), F.normalize(val_x.float(), dim=1)
    chunk = chunk or max(1, min(1024, 2**28 // max(1, len(train_x))))
    found = min(k, len(train_x))
    sims, labels = [], []
    for i in range(0, len(val_x), chunk):
        sim, idx = (val_x[i:i + chunk] @ train_x.T).topk(found, dim=1)
        sims.append(sim)
        labels.append(train_y.to(sim.device)[idx])
    sim = torch.cat(sims) if sims else val_x.new_zeros(0, found)
    label = torch.cat(labels) if labels else torch.zeros(0, found, dtype=torch.long, device=val_x.device)
    if found < k:  # a share smaller than k: pad, so that every share's candidates have one shape
        sim = torch.cat([sim, sim.new_full((len(sim), k - found), float("-inf"))], dim=1)
        label = torch.cat([label, label.new_zeros(len(label), k - found)], dim=1)
    return sim, label


def nearest(sim: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most similar of candidates (V, C) joined from several shares (C ≥ k), with their labels."""
    sim, idx = sim.topk(k, dim=1)
    return sim, labels.gather(1, idx)


def knn_votes(sim: torch.Tensor, labels: torch.Tensor, n_classes: int, temperature: float = 0.07) -> torch.Tensor:
    """Class votes (V, K): each neighbour votes exp(sim / T) for its label (a padded one, at −inf, votes 0)."""
    votes = torch.zeros(len(sim), n_classes, device=sim.device)
    return votes.scatter_add_(1, labels, (sim / temperature).exp())


def knn_scores(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, k: int = 20,
               temperature: float = 0.07, n_classes: int | None = None, chunk: int = 1024) -> torch.Tensor:
    """Class votes (V, K) of a cosine kNN: each of the k nearest train features votes exp(sim / T) for its label."""
    n_classes = n_classes or int(train_y.max()) + 1
    k = min(k, len(train_x))
    return knn_votes(*knn_neighbours(train_x, train_y, val_x, k, chunk), n_classes, temperature)


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
