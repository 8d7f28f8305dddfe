"""Frozen-feature evaluation on toy features: the linear probe and the cosine kNN separate what is separable and sit at
chance on shuffled labels; the probe reaches the optimum of its objective whatever the caller's BLAS threads; top-k and
confusion counts match a direct count."""

from __future__ import annotations

import warnings

import pytest
import torch
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from ropim.eval.knn import knn_neighbours, knn_probe, knn_scores, knn_top1, knn_votes, nearest
from ropim.eval.linear import fit_linear_probe, linear_probe
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


def test_knn_over_shares_of_the_train_features_votes_as_one_bank():
    """Train features split over 3 processes (one share smaller than k): each share's k nearest, joined, then the k
    nearest of them, vote as the whole bank's k nearest do."""
    train_x, train_y, val_x, _ = toy(per_class=(9, 20), spread=1.0)  # overlapping classes: the votes are mixed
    shares = [slice(0, 50), slice(50, 55), slice(55, None)]  # 50, 5 (< k) and 35 train features
    found = [knn_neighbours(train_x[s], train_y[s], val_x, k=10) for s in shares]
    sim, labels = nearest(torch.cat([f[0] for f in found], 1), torch.cat([f[1] for f in found], 1), k=10)
    whole = knn_scores(train_x, train_y, val_x, k=10)
    assert torch.allclose(knn_votes(sim, labels, 10), whole, rtol=1e-5)
    assert not torch.allclose(knn_votes(*found[0], 10), whole, rtol=1e-3)  # one share alone votes otherwise


def test_probe_and_knn_are_at_chance_on_shuffled_labels():
    train_x, train_y, val_x, val_y = toy(per_class=(60, 50))
    g = torch.Generator().manual_seed(1)
    train_y, val_y = train_y[torch.randperm(len(train_y), generator=g)], val_y[torch.randperm(len(val_y), generator=g)]
    lin = linear_probe(train_x, train_y, val_x, val_y)
    knn = knn_probe(train_x, train_y, val_x, val_y, k=20)
    for r in (lin, knn):  # chance: 10% top-1, 50% top-5; 500 val points, so ± ~3 points is one std of top-5
        assert 3 < r["top1"] < 20 and 38 < r["top5"] < 62, r


def correlated(n=1000, dim=64, n_classes=10, rank=8, seed=0):
    """Features of rank ~8 in 64 dimensions and overlapping classes: an ill-conditioned fit, as frozen features give."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, rank, generator=g) @ torch.randn(rank, dim, generator=g)
    x = x + 0.05 * torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, n_classes, generator=g) + 3 * torch.randn(n, n_classes, generator=g)).argmax(1)
    return x, y


def objective_gradient(probe, x, y, c=1.0) -> float:
    """max |∂/∂(W, b)| of scikit-learn's objective C · Σ cross-entropy + ½‖W‖² at the fitted probe (float64)."""
    z = torch.as_tensor(probe[0].transform(x.numpy()), dtype=torch.float64)
    w = torch.tensor(probe[-1].coef_, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(probe[-1].intercept_, dtype=torch.float64, requires_grad=True)
    loss = c * torch.nn.functional.cross_entropy(z @ w.T + b, y, reduction="sum") + 0.5 * (w ** 2).sum()
    loss.backward()
    return max(w.grad.abs().max().item(), b.grad.abs().max().item())


def test_probe_reaches_the_optimum_whatever_the_threads():
    x, y = correlated()
    probe = fit_linear_probe(x, y)
    assert objective_gradient(probe, x, y) < 1e-3  # scikit-learn's default L-BFGS stopped at ~0.08 here
    with threadpool_limits(2):
        again = fit_linear_probe(x, y)  # the fit pins its own threads: bit for bit the same
    assert (again[-1].coef_ == probe[-1].coef_).all() and (again[-1].intercept_ == probe[-1].intercept_).all()
    wide_x, wide_y = correlated(n=200, dim=500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # 50 iterations: enough to see the solver
        assert fit_linear_probe(wide_x, wide_y, max_iter=50)[-1].solver == "lbfgs"  # 501 × 10 weights: no Hessian


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


def test_features_read_in_another_order_come_back_in_the_datasets():
    from ropim.eval.features import extract_features

    encoder = torch.nn.Linear(4, 3)
    encoder.forward_features = encoder.forward
    encoder.forward_head = lambda f, pre_logits: f
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.arange(10))
    here_x, here_y = extract_features(encoder, data, batch_size=3)
    read = [9, 0, 8, 1, 7, 2, 6, 3, 5, 4]
    seen = []
    x, y = extract_features(encoder, data, batch_size=3, order=read, progress=seen.append)
    assert torch.equal(y, here_y) and torch.allclose(x, here_x) and seen == [3, 3, 3, 1]
