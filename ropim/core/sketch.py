"""Count-sketch random orthogonal projection along the token axis.

For one image with N tokens, a sketch draws bucket ids h ∈ [0, K')^N and signs s ∈ {±1}^N.
The sketching matrix P ∈ {-1, 0, 1}^{K'×N} has P[i, j] = s_j·δ(h_j = i), P Pᵀ = diag(c) with
c the bucket sizes, and the exact orthogonal projector onto P's row space is

    Π = Pᵀ diag(1/c) P            (empty buckets contribute nothing)

``project`` applies Π with one scatter-add (P x) and one gather (Pᵀ y): O(B·N·D), no N×N matrix;
its backward applies Π again (Π is symmetric). With ``literal_scale`` it applies the paper's code's operator
S = ρ·PᵀP instead (ρ as written: its 0.14·PᵀP is 0.98 Π at N = 196, so S is not idempotent).

Three ways to draw h and s (``draw_sketch``): ``balanced`` (the default), ``uniform``, and ``official``, the paper's
code's (csiro-robotics/ROPIM ``data/data_ropim.py``, ``SketchGenerator``): h is ⌈N/K'⌉ random permutations of the
K' buckets laid end to end, so two tokens in the same run of K' consecutive tokens never share a bucket, and s is
a random arrangement of N/2 signs +1 and N/2 signs −1. Their generator needs K' | N and N even (it fails at
N = 64, 49, 256, 784); here the last run is cut to N mod K' tokens and, for odd N, the sign list to N entries, so
bucket sizes differ by at most one and ⌊N/2⌋ or ⌈N/2⌉ signs are positive.
Pure torch: no Ray, no timm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ropim.core.config import check_hashing, n_buckets_for


@dataclass(frozen=True)
class Sketch:
    """A batch of count sketches: one (h, s) per image."""

    h: torch.Tensor  # (B, N) int64 bucket ids in [0, K')
    s: torch.Tensor  # (B, N) float signs ±1
    n_buckets: int  # K'
    counts: torch.Tensor  # (B, K') float bucket sizes c
    slots: torch.Tensor  # (B·N,) int64 slot of each token (``token_slots``), drawn with h and s
    scale: float | None = None  # None: Π = Pᵀ diag(1/c) P; a number ρ: S = ρ·PᵀP (the paper's code)

    @property
    def n_tokens(self) -> int:
        return self.h.shape[1]

    def _bucket_sums(self, x: torch.Tensor) -> torch.Tensor:
        """P x as (B·K', D): bucket i = Σ_{j: h_j = i} s_j x_j (one scatter-add over the full tensor)."""
        b, n, d = x.shape
        sums = x.new_zeros(2 * b * self.n_buckets, d).index_add_(0, self.slots, x.reshape(b * n, d))
        sums = sums.view(b * self.n_buckets, 2, d)  # (B·K', [s = +1, s = −1], D)
        return sums[:, 0] - sums[:, 1]

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """Π x without autograd bookkeeping: y = diag(1/c) P x (or ρ·P x) on the K' bucket rows, then row
        j = s_j y_{h_j} as one gather from the table [y, −y] (empty buckets have y = 0, so clamping c never
        changes Π)."""
        b, n, d = x.shape
        y = self._bucket_sums(x)  # (B·K', D)
        y = y * self.scale if self.scale is not None else y / self.counts.clamp(min=1).reshape(-1, 1).to(x.dtype)
        table = torch.stack((y, -y), dim=1).view(2 * b * self.n_buckets, d)
        return table.index_select(0, self.slots).view(b, n, d)

    def sketch(self, x: torch.Tensor) -> torch.Tensor:
        """P x: (B, N, D) -> (B, K', D), bucket i = Σ_{j: h_j = i} s_j x_j."""
        return self._bucket_sums(x).view(x.shape[0], self.n_buckets, x.shape[2])

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Π x = Pᵀ diag(1/c) P x (or S x = ρ·PᵀP x) along the token axis: (B, N, D) -> (B, N, D), same dtype."""
        return _Projection.apply(x, self)

    def complement(self, x: torch.Tensor) -> torch.Tensor:
        """(I − Π) x (or (I − S) x)."""
        return x - self.project(x)

    def matrix(self) -> torch.Tensor:
        """P as dense (B, K', N) float32 matrices, for tests and pictures only."""
        b, n = self.h.shape
        p = torch.zeros(b, self.n_buckets, n, dtype=torch.float32, device=self.h.device)
        return p.scatter_(1, self.h.unsqueeze(1), self.s.float().unsqueeze(1))

    def dense(self) -> torch.Tensor:
        """Π (or S) as dense (B, N, N) float32 matrices, for tests and pictures only."""
        p = self.matrix()
        inv_c = torch.where(self.counts > 0, 1.0 / self.counts.clamp(min=1), torch.zeros_like(self.counts))
        weights = inv_c if self.scale is None else torch.full_like(inv_c, self.scale)
        return p.transpose(1, 2) @ (weights.float().unsqueeze(-1) * p)


def token_slots(h: torch.Tensor, s: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """(B·N,) slot of each token: bucket i of image b has slots 2(b·K' + i) (s = +1) and 2(b·K' + i) + 1 (s = −1),
    so a plain index_add sums each bucket's two sign groups without multiplying by s. Computed once per sketch,
    when it is drawn, so that the projection itself is plain tensor code (torch.compile traces it whole)."""
    rows = h + torch.arange(h.shape[0], device=h.device).unsqueeze(1) * n_buckets  # (B, N)
    return (2 * rows + (s < 0)).reshape(-1)


class _Projection(torch.autograd.Function):
    """Π x whose backward is Π g: Π is symmetric, so the gradient needs one more gather/scatter pair rather
    than autograd's chain through each index op (a third less time for forward + backward)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, sketch: Sketch) -> torch.Tensor:
        ctx.sketch = sketch
        return sketch._project(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.sketch._project(grad), None


def draw_sketch(
    batch_size: int,
    n_tokens: int,
    rho: float,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    hashing: str = "balanced",
    literal_scale: bool = False,
) -> Sketch:
    """Draw one count sketch per image on ``device`` from ``generator``.

    ``balanced``: a random permutation of the tokens, the token at rank k goes to bucket k mod K' (bucket sizes
    differ by at most one, as in the paper's code, but any two tokens may share a bucket), signs i.i.d.
    ``uniform``: h_j i.i.d. uniform, signs i.i.d. ``official``: the paper's code's buckets and signs (module
    docstring). ``literal_scale``: the sketch applies S = ρ·PᵀP rather than Π.
    """
    k = n_buckets_for(n_tokens, rho)
    check_hashing(hashing)
    if generator is not None and device is None:
        device = generator.device
    shape = (batch_size, n_tokens)
    if hashing == "official":
        h, s = official_hashes(batch_size, n_tokens, k, generator, device)
    else:
        if hashing == "balanced":
            perm = torch.rand(shape, generator=generator, device=device).argsort(dim=1)
            buckets = (torch.arange(n_tokens, device=device) % k).expand(shape)
            h = torch.empty(shape, dtype=torch.int64, device=device).scatter_(1, perm, buckets)
        else:
            h = torch.randint(0, k, shape, generator=generator, device=device)
        s = torch.randint(0, 2, shape, generator=generator, device=device).float().mul_(2).sub_(1)
    counts = torch.zeros(batch_size, k, device=device).scatter_add_(1, h, torch.ones(shape, device=device))
    return Sketch(h=h, s=s, n_buckets=k, counts=counts, slots=token_slots(h, s, k),
                  scale=float(rho) if literal_scale else None)


def official_hashes(batch_size: int, n_tokens: int, n_buckets: int, generator: torch.Generator | None,
                    device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, s) of the paper's code, one per image: h the first N entries of ⌈N/K'⌉ random permutations of
    0…K'−1 laid end to end, s the first N entries of a random permutation of [−1, +1] × ⌈N/2⌉."""
    runs, n_signs = -(-n_tokens // n_buckets), n_tokens + n_tokens % 2
    blocks = torch.rand(batch_size, runs, n_buckets, generator=generator, device=device).argsort(dim=2)
    h = blocks.reshape(batch_size, runs * n_buckets)[:, :n_tokens].contiguous()
    ranks = torch.rand(batch_size, n_signs, generator=generator, device=device).argsort(dim=1)[:, :n_tokens]
    return h, (ranks % 2).float().mul_(2).sub_(1)  # list entry r of [−1, +1, −1, …] is +1 for odd r
