"""Tests for the count-sketch projector: Π = Pᵀ diag(1/c) P along the token axis."""

from __future__ import annotations

import math

import pytest
import torch

from ropim.core.sketch import draw_sketch


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def literal_p_and_pi(h: list[int], s: list[float], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """P and Π for one image, built literally from Proposition 1 with Python loops (float64).

    P_ij = s_j δ(h_j − i); c_i = |{j : h_j = i}|; Π = Σ_{i: c_i > 0} (1/c_i) P_iᵀ P_i = Pᵀ diag(1/c) P.
    """
    n = len(h)
    p = [[0.0] * n for _ in range(k)]
    for i in range(k):
        for j in range(n):
            if h[j] == i:
                p[i][j] = s[j]
    c = [sum(1 for j in range(n) if h[j] == i) for i in range(k)]
    pi = [[0.0] * n for _ in range(n)]
    for i in range(k):
        if c[i] == 0:
            continue  # empty bucket: contributes nothing
        for a in range(n):
            for b in range(n):
                pi[a][b] += p[i][a] * p[i][b] / c[i]
    return torch.tensor(p, dtype=torch.float64), torch.tensor(pi, dtype=torch.float64)


# Uniform hashing with a small K' (N=12, rho=0.5 -> K'=6; N=10, rho=0.3 -> K'=3 ...): some empty buckets.
UNIFORM_CASES = [(12, 0.5), (10, 0.3), (16, 0.25), (20, 0.5)]


@pytest.fixture(scope="module")
def uniform_sketches():
    return [
        draw_sketch(8, n, rho, generator=gen(10 + i), hashing="uniform") for i, (n, rho) in enumerate(UNIFORM_CASES)
    ]


def test_uniform_cases_include_empty_buckets(uniform_sketches):
    n_empty = sum(int((sk.counts == 0).sum()) for sk in uniform_sketches)
    assert n_empty > 0, "the uniform-hashing cases must exercise empty buckets"
    for sk in uniform_sketches:
        assert sk.counts.shape == (8, sk.n_buckets)
        assert torch.equal(sk.counts.sum(1), torch.full((8,), float(sk.n_tokens)))
        assert int(sk.h.min()) >= 0 and int(sk.h.max()) < sk.n_buckets
        assert set(sk.s.unique().tolist()) <= {-1.0, 1.0}


@pytest.mark.parametrize("hashing", ["uniform", "balanced"])
def test_projector_is_symmetric_idempotent_with_rank_equal_to_nonempty_buckets(uniform_sketches, hashing):
    sketches = uniform_sketches if hashing == "uniform" else [draw_sketch(8, 30, 0.2, generator=gen(3))]
    for sk in sketches:
        pi = sk.dense().double()
        n = sk.n_tokens
        assert pi.shape == (8, n, n)
        torch.testing.assert_close(pi, pi.transpose(1, 2), rtol=0, atol=1e-7)
        torch.testing.assert_close(pi @ pi, pi, rtol=0, atol=1e-6)
        nonempty = (sk.counts > 0).sum(1)
        torch.testing.assert_close(torch.linalg.matrix_rank(pi), nonempty)
        # trace of an orthogonal projector = its rank
        torch.testing.assert_close(pi.diagonal(dim1=1, dim2=2).sum(-1), nonempty.double(), rtol=0, atol=1e-5)


def test_uniform_rank_is_below_k_prime_when_a_bucket_is_empty(uniform_sketches):
    for sk in uniform_sketches:
        for b in range(sk.h.shape[0]):
            if (sk.counts[b] == 0).any():
                rank = int(torch.linalg.matrix_rank(sk.dense()[b].double()))
                assert rank < sk.n_buckets
                return
    pytest.fail("no empty bucket found")


def test_project_and_complement_match_dense(uniform_sketches):
    for i, sk in enumerate(uniform_sketches):
        x = torch.randn(8, sk.n_tokens, 5, generator=gen(100 + i))
        pi = sk.dense().double()
        ref = pi @ x.double()
        px = sk.project(x)
        torch.testing.assert_close(px.double(), ref, rtol=1e-5, atol=1e-5)
        qx = sk.complement(x)
        torch.testing.assert_close(qx.double(), x.double() - ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(px + qx, x, rtol=0, atol=1e-6)
        # the two parts are orthogonal and the complement is annihilated by Π
        assert (px.double() * qx.double()).sum(1).abs().max() < 1e-4
        assert sk.project(qx).abs().max() < 1e-5
        # project is not the identity (K' < N), so the checks above are not vacuous
        assert qx.abs().max() > 1e-2


def test_dense_equals_literal_proposition_1(uniform_sketches):
    balanced = draw_sketch(3, 14, 0.3, generator=gen(4))  # K' = 5, sizes 3 or 2
    for sk in [*uniform_sketches, balanced]:
        dense = sk.dense().double()
        matrix = sk.matrix().double()
        for b in range(sk.h.shape[0]):
            p, pi = literal_p_and_pi(sk.h[b].tolist(), sk.s[b].tolist(), sk.n_buckets)
            torch.testing.assert_close(matrix[b], p, rtol=0, atol=0)
            torch.testing.assert_close(dense[b], pi, rtol=0, atol=1e-6)
            # P Pᵀ = diag(c)
            torch.testing.assert_close(p @ p.T, torch.diag(sk.counts[b].double()), rtol=0, atol=0)


@pytest.mark.parametrize(("n", "rho", "k"), [(196, 1 / 7, 28), (64, 0.25, 16), (12, 1 / 3, 4)])
def test_balanced_hashing_with_divisible_n_matches_paper_pseudoinverse(n, rho, k):
    sk = draw_sketch(4, n, rho, generator=gen(5))
    assert sk.n_buckets == k
    assert torch.equal(sk.counts, torch.full((4, k), float(n // k)))
    p = sk.matrix().double()
    paper = (k / n) * p.transpose(1, 2) @ p  # P† P with P† = (K'/K) Pᵀ
    torch.testing.assert_close(sk.dense().double(), paper, rtol=0, atol=1e-6)
    x = torch.randn(4, n, 3, generator=gen(6))
    torch.testing.assert_close(sk.project(x).double(), paper @ x.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("n", "rho", "k"),
    [
        (196, 0.14, 28),
        (196, 1 / 7, 28),
        # rho·N lands just above an integer in floating point: a plain ceil would give one bucket too many
        (25, 7 / 25, 7),  # 7.000000000000001
        (273, 1 / 91, 3),  # 3.0000000000000004
        (196, 0.25, 49),
        (196, 0.07, 14),
        (196, 0.5, 98),
        (64, 0.25, 16),
        (10, 0.31, 4),  # plain ceil: 3.1 -> 4
        (196, 1e-9, 1),  # clipped below to 1
        (4, 0.999, 3),  # clipped above to N − 1
        (2, 0.5, 1),
    ],
)
def test_n_buckets_rounding_and_clipping(n, rho, k):
    assert draw_sketch(1, n, rho, generator=gen()).n_buckets == k


@pytest.mark.parametrize(("n", "rho"), [(196, 1 / 7), (50, 0.14), (49, 0.2), (37, 0.5), (10, 0.999), (64, 0.3)])
def test_balanced_bucket_sizes_differ_by_at_most_one(n, rho):
    sk = draw_sketch(16, n, rho, generator=gen(7))
    c = sk.counts
    assert (c.max(1).values - c.min(1).values).max() <= 1
    assert (c.min(1).values >= 1).all()
    assert torch.equal(c.sum(1), torch.full((16,), float(n)))
    # counts agree with h
    recount = torch.stack([torch.bincount(row, minlength=sk.n_buckets) for row in sk.h]).float()
    assert torch.equal(recount, c)
    # the assignment is random per image: not every image gets the same h
    assert not all(torch.equal(sk.h[0], sk.h[b]) for b in range(1, 16))


def test_property_1_inner_products_of_sketches_are_unbiased():
    """E⟨Px, Py⟩ = ⟨x, y⟩ for uniform h and random s; Var ≤ (⟨x,y⟩² + ‖x‖²‖y‖²)/K'."""
    n, rho, draws = 32, 0.25, 20_000
    g = gen(123)
    x = torch.randn(n, generator=g, dtype=torch.float64)
    y = 0.7 * x + torch.randn(n, generator=g, dtype=torch.float64)
    x[0], y[0] = 4.0, 4.0  # a heavy coordinate so collisions matter
    sk = draw_sketch(draws, n, rho, generator=gen(321), hashing="uniform")
    k = sk.n_buckets
    assert k == 8
    px = sk.sketch(x.expand(draws, n).unsqueeze(-1))  # (draws, K', 1)
    py = sk.sketch(y.expand(draws, n).unsqueeze(-1))
    assert px.shape == (draws, k, 1)
    est = (px * py).sum(dim=(1, 2))  # one estimate of ⟨x, y⟩ per draw
    xy, xx, yy = float(x @ y), float(x @ x), float(y @ y)
    bound = (xy**2 + xx * yy) / k
    tol = 5 * math.sqrt(bound / draws)
    assert abs(float(est.mean()) - xy) < tol, (float(est.mean()), xy, tol)
    var = float(est.var())
    assert 0 < var <= 1.1 * bound, (var, bound)
    # the sketch is not exact per draw, so the mean check above is a real statistical test
    assert float((est - xy).abs().max()) > 1.0


def test_sketch_is_p_times_x():
    sk = draw_sketch(5, 21, 0.3, generator=gen(8), hashing="uniform")
    x = torch.randn(5, 21, 4, generator=gen(9))
    torch.testing.assert_close(sk.sketch(x), sk.matrix() @ x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hashing", ["balanced", "uniform", "official"])
def test_seed_reproducibility(hashing):
    a = draw_sketch(4, 49, 1 / 7, generator=gen(42), hashing=hashing)
    b = draw_sketch(4, 49, 1 / 7, generator=gen(42), hashing=hashing)
    c = draw_sketch(4, 49, 1 / 7, generator=gen(43), hashing=hashing)
    assert torch.equal(a.h, b.h) and torch.equal(a.s, b.s) and torch.equal(a.counts, b.counts)
    assert not torch.equal(a.h, c.h)
    assert not torch.equal(a.s, c.s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_project_keeps_dtype_and_shape(dtype):
    sk = draw_sketch(3, 16, 0.25, generator=gen(11))
    x = torch.randn(3, 16, 7, generator=gen(12)).to(dtype)
    for out in (sk.project(x), sk.complement(x)):
        assert out.dtype == dtype
        assert out.shape == x.shape
    ref = sk.dense().double() @ x.double()
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(sk.project(x).double(), ref, rtol=tol, atol=tol)


def test_gradients_match_the_dense_transpose(uniform_sketches):
    """project's hand-written backward (Π g) is the true gradient: Πᵀ w from the dense matrix, and gradcheck in
    float64, on sketches with empty buckets."""
    for sk in uniform_sketches:
        b, n = sk.h.shape
        x = torch.randn(b, n, 3, generator=gen(14), requires_grad=True)
        w = torch.randn(b, n, 3, generator=gen(15))
        pi_t = sk.dense().transpose(1, 2)
        (sk.project(x) * w).sum().backward()  # d/dx ⟨Πx, w⟩ = Πᵀ w
        torch.testing.assert_close(x.grad, pi_t @ w, rtol=1e-5, atol=1e-6)
        x.grad = None
        (sk.complement(x) * w).sum().backward()
        torch.testing.assert_close(x.grad, w - pi_t @ w, rtol=1e-5, atol=1e-6)
        x64 = torch.randn(b, n, 2, generator=gen(16), dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(sk.project, (x64,))
        assert torch.autograd.gradcheck(sk.complement, (x64,))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rho=0.0), r"rho=0\.0"),
        (dict(rho=-0.1), r"rho=-0\.1"),
        (dict(rho=1.0), r"rho=1\.0"),
        (dict(rho=1.5), r"rho=1\.5"),
        (dict(rho=float("nan")), r"rho=nan"),
        (dict(n_tokens=1), r"n_tokens=1"),
        (dict(n_tokens=0), r"n_tokens=0"),
        (dict(hashing="gaussian"), r"hashing='gaussian'"),
    ],
)
def test_bad_input_raises_value_error_naming_the_value(kwargs, match):
    args = dict(batch_size=2, n_tokens=16, rho=0.25) | kwargs
    batch_size, n_tokens, rho = args.pop("batch_size"), args.pop("n_tokens"), args.pop("rho")
    with pytest.raises(ValueError, match=match):
        draw_sketch(batch_size, n_tokens, rho, generator=gen(), **args)
