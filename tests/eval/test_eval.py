"""Frozen-feature evaluation on toy features: the linear probe and the cosine kNN separate what is separable and sit at
chance on shuffled labels; top-k and confusion counts match a direct count."""

from __future__ import annotations

import pytest
import torch

from ropim.eval.knn import knn_probe, knn_top1
from ropim.eval.linear import linear_probe
from ropim.eval.metrics import confusion_matrix, per_class_accuracy, topk_accuracy


def toy(n_classes=10, dim=32, per_class=(40, 20), seed=0, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, dim, generator=g) * spread
    out = []
    for n in per_class:
        y = torch.arange(n_classes).repeat_interleave(n)
        out += [centers[y] + torch.randn(len(y), dim, generator=g), y]
    return out  # train_x, train_y, val_x, val_y


def test_probe_and_knn_separate_a_separable_toy_set():
    train_x, train_y, val_x, val_y = toy()
    lin = linear_probe(train_x, train_y, val_x, val_y)
    knn = knn_probe(train_x, train_y, val_x, val_y, k=10)
    assert lin["top1"] > 95 and knn["top1"] > 95
    assert lin["top5"] >= lin["top1"] and knn["top5"] >= knn["top1"]
    assert lin["scores"].shape == knn["scores"].shape == (200, 10)
    assert knn_top1(train_x, train_y, val_x, val_y, k=10) == pytest.approx(knn["top1"])


def test_probe_and_knn_are_at_chance_on_shuffled_labels():
    train_x, train_y, val_x, val_y = toy(per_class=(60, 50))
    g = torch.Generator().manual_seed(1)
    train_y, val_y = train_y[torch.randperm(len(train_y), generator=g)], val_y[torch.randperm(len(val_y), generator=g)]
    lin = linear_probe(train_x, train_y, val_x, val_y)
    knn = knn_probe(train_x, train_y, val_x, val_y, k=20)
    for r in (lin, knn):  # chance: 10% top-1, 50% top-5; 500 val points, so ± ~3 points is one std of top-5
        assert 3 < r["top1"] < 20 and 38 < r["top5"] < 62, r


def test_topk_and_confusion_match_a_direct_count():
    g = torch.Generator().manual_seed(0)
    scores, target = torch.randn(300, 7, generator=g), torch.randint(0, 7, (300,), generator=g)
    top = scores.topk(5, dim=1).indices
    acc = topk_accuracy(scores, target)
    assert acc["top1"] == pytest.approx(100 * (top[:, 0] == target).float().mean().item())
    assert acc["top5"] == pytest.approx(100 * (top == target[:, None]).any(1).float().mean().item())
    conf = confusion_matrix(scores.argmax(1), target, 7)
    assert conf.sum() == 300 and conf.diag().sum() == (scores.argmax(1) == target).sum()
    assert conf[target[0], scores[0].argmax()] >= 1
    recall = per_class_accuracy(conf)
    assert recall[3] == pytest.approx(100 * conf[3, 3].item() / conf[3].sum().item())
