"""`model.hashing: official` and `model.literal_scale`: the paper's code's sketch (csiro-robotics/ROPIM
`data/data_ropim.py`, `SketchGenerator`), against a re-implementation of that generator written here from its text:
h = ⌈N/K'⌉ random permutations of the K' buckets laid end to end, signs = a shuffled [−1, +1] × ⌈N/2⌉,
S = 0.14·PᵀP (P its N×K' dense sketch, transposed)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM, patchify
from ropim.core.sketch import draw_sketch

N, RATIO, K = 196, 0.14, 28  # 14×14 tokens; ceil(196 · 0.14) = 28 buckets of 7
DRAWS = 400


def reference(n: int, rng: random.Random, ratio: float = RATIO) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h, s, S) of one image as the official generator draws them; raises where theirs does (a run of K' that
    does not fit, a sign list longer than N)."""
    k = int(np.ceil(n * ratio))
    h = np.zeros(n)
    for i in range(int(np.ceil(n / k))):
        h[i * k:(i + 1) * k] = rng.sample(range(k), k)  # their torch.randperm(k)
    signs = [-1, 1] * int(np.ceil(n / 2))
    rng.shuffle(signs)
    p_t = np.zeros((n, k))
    p_t[np.arange(n), h.astype(int)] = signs
    return h.astype(int), np.asarray(signs, dtype=float), p_t @ (p_t.T * ratio)


def same_bucket_rates(h: np.ndarray, k: int) -> tuple[float, float]:
    """Over images (rows of h): the share of token pairs in one run of k consecutive tokens that share a bucket, and
    the share of pairs in different runs that do."""
    n = h.shape[1]
    same = h[:, :, None] == h[:, None, :]  # (B, N, N)
    run = np.arange(n) // k
    in_run = (run[:, None] == run[None, :]) & ~np.eye(n, dtype=bool)
    return float(same[:, in_run].mean()), float(same[:, run[:, None] != run[None, :]].mean())


@pytest.fixture(scope="module")
def ours():
    return draw_sketch(DRAWS, N, RATIO, generator=torch.Generator().manual_seed(0), hashing="official",
                       literal_scale=True)


@pytest.fixture(scope="module")
def theirs():
    rng = random.Random(0)
    return [reference(N, rng) for _ in range(DRAWS)]


def test_buckets_never_repeat_within_a_run_and_hold_seven_tokens(ours, theirs):
    assert ours.n_buckets == K
    h_ours, h_theirs = ours.h.numpy(), np.stack([h for h, _, _ in theirs])
    in_ours, across_ours = same_bucket_rates(h_ours, K)
    in_theirs, across_theirs = same_bucket_rates(h_theirs, K)
    assert in_ours == in_theirs == 0.0
    assert across_ours == pytest.approx(1 / K, rel=0.03) and across_theirs == pytest.approx(1 / K, rel=0.03)
    assert torch.equal(ours.counts, torch.full((DRAWS, K), 7.0))
    assert all((np.bincount(h, minlength=K) == 7).all() for h in h_theirs)
    balanced = draw_sketch(DRAWS, N, RATIO, generator=torch.Generator().manual_seed(0))  # ours by default: 6/195
    assert same_bucket_rates(balanced.h.numpy(), K)[0] == pytest.approx(6 / 195, rel=0.05)


def test_exactly_half_the_signs_are_positive(ours, theirs):
    assert torch.equal((ours.s > 0).sum(1), torch.full((DRAWS,), N // 2))
    assert all((s > 0).sum() == N // 2 for _, s, _ in theirs)
    assert 0.45 < (ours.s[:, 0] > 0).float().mean() < 0.55  # and which ones is random


def test_the_literal_scale_is_point_14_times_pt_p(ours, theirs):
    """S = 0.14·PᵀP: diagonal 0.14, trace 27.44, eigenvalues 0.98 (28 times) and 0, so S² = 0.98 S ≠ S and the
    loss complement I − S = I − 0.98 Π; the same numbers from their generator."""
    s_ours = ours.dense()[:8].double()
    exact = draw_sketch(1, N, RATIO, generator=torch.Generator().manual_seed(0), hashing="official")
    assert exact.scale is None and ours.scale == RATIO
    for s in [*s_ours.numpy(), *(ref for _, _, ref in theirs[:8])]:
        np.testing.assert_allclose(np.diag(s), RATIO, rtol=0, atol=1e-6)
        assert np.trace(s) == pytest.approx(27.44, abs=1e-4)
        eig = np.linalg.eigvalsh(s)
        np.testing.assert_allclose(eig[-K:], 0.98, rtol=0, atol=1e-5)
        np.testing.assert_allclose(eig[:-K], 0.0, rtol=0, atol=1e-5)
    p = ours.matrix()[:8].double()
    pi = p.transpose(1, 2) @ p / 7  # the exact projector of the same buckets and signs
    torch.testing.assert_close(s_ours, 0.98 * pi, rtol=0, atol=1e-6)
    x = torch.randn(8, N, 5, generator=torch.Generator().manual_seed(1))
    sketch8 = draw_sketch(8, N, RATIO, generator=torch.Generator().manual_seed(0), hashing="official",
                          literal_scale=True)
    q = torch.eye(N, dtype=torch.float64) - sketch8.dense().double()
    torch.testing.assert_close(sketch8.complement(x).double(), q @ x.double(), rtol=1e-5, atol=1e-5)


def test_the_model_loss_takes_the_literal_complement():
    cfg = ModelConfig(img_size=56, patch_size=4, depth=1, rho=RATIO, hashing="official", literal_scale=True)
    model = ROPIM(cfg).eval()  # 14×14 tokens, as at 224/16
    imgs = torch.randn(2, 3, 56, 56, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        loss, pred, sketch = model(imgs, torch.Generator().manual_seed(3))
    assert sketch.scale == RATIO and torch.equal(sketch.counts, torch.full((2, K), 7.0))
    diff = (patchify(imgs, 4) - pred).double()
    expected = (diff - sketch.dense().double() @ diff).abs().mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize(("n", "k"), [(64, 9), (49, 7), (256, 36), (784, 110)])
def test_where_their_generator_fails_ours_cuts_the_last_run_and_the_sign_list(n, k):
    with pytest.raises((ValueError, IndexError)):
        reference(n, random.Random(0))
    sk = draw_sketch(32, n, RATIO, generator=torch.Generator().manual_seed(4), hashing="official")
    assert sk.n_buckets == k
    assert same_bucket_rates(sk.h.numpy(), k)[0] == 0.0  # the cut last run too
    assert (sk.counts.max(1).values - sk.counts.min(1).values).max() <= 1
    positives = (sk.s > 0).sum(1)
    assert set(positives.tolist()) <= {n // 2, math.ceil(n / 2)}
    if n % 2:
        assert len(set(positives.tolist())) == 2  # odd N: ⌊N/2⌋ or ⌈N/2⌉, at random
    pi = sk.dense().double()
    torch.testing.assert_close(pi @ pi, pi, rtol=0, atol=1e-6)  # without literal_scale: the exact Π
