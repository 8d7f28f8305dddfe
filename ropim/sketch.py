"""Count-sketch random orthogonal projection along the token axis (DESIGN.md §1).

For one image with N tokens, a sketch draws bucket ids h ∈ [0, K')^N and signs s ∈ {±1}^N.
The sketching matrix P ∈ {-1, 0, 1}^{K'×N} has P[i, j] = s_j·δ(h_j = i), P Pᵀ = diag(c) with
c the bucket sizes, and the exact orthogonal projector onto P's row space is

    Π = Pᵀ diag(1/c) P            (empty buckets contribute nothing)

``project`` applies Π with one scatter-add (P x) and one gather (Pᵀ y): O(B·N·D), no N×N matrix.
Pure torch: no Ray, no timm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ropim.errors import ConfigError

HASHINGS = ("balanced", "uniform")


def n_buckets_for(n_tokens: int, rho: float) -> int:
    """K' = ceil(rho·N − 1e-6) clipped to [1, N−1]; rho = 1/7 at N = 196 gives 28, not 29."""
    check_rho(rho)
    if n_tokens < 2:
        raise ConfigError(f"n_tokens={n_tokens}: a sketch needs at least 2 tokens (use a smaller patch_size)")
    return min(max(math.ceil(rho * n_tokens - 1e-6), 1), n_tokens - 1)


def check_rho(rho: float) -> None:
    """Raise ConfigError (a ValueError) unless 0 < rho < 1."""
    if not (isinstance(rho, (int, float)) and 0.0 < rho < 1.0):
        raise ConfigError(f"rho={rho!r}: the sketch ratio must satisfy 0 < rho < 1 (the paper's default is 1/7)")


@dataclass(frozen=True)
class Sketch:
    """A batch of count sketches: one (h, s) per image."""

    h: torch.Tensor  # (B, N) int64 bucket ids in [0, K')
    s: torch.Tensor  # (B, N) float signs ±1
    n_buckets: int  # K'
    counts: torch.Tensor  # (B, K') float bucket sizes c

    @property
    def n_tokens(self) -> int:
        return self.h.shape[1]

    def _flat_index(self) -> torch.Tensor:
        """(B·N,) bucket ids made unique per image: image b's bucket i is row b·K' + i."""
        b = self.h.shape[0]
        offsets = torch.arange(b, device=self.h.device).unsqueeze(1) * self.n_buckets
        return (self.h + offsets).reshape(-1)

    def _sketch_flat(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """P x as (B·K', D) rows, scatter-added along ``index``."""
        b, n, d = x.shape
        signed = (x * self.s.to(x.dtype).unsqueeze(-1)).reshape(b * n, d)
        return x.new_zeros(b * self.n_buckets, d).index_add_(0, index, signed)

    def sketch(self, x: torch.Tensor) -> torch.Tensor:
        """P x: (B, N, D) -> (B, K', D), bucket i = Σ_{j: h_j = i} s_j x_j."""
        return self._sketch_flat(x, self._flat_index()).view(x.shape[0], self.n_buckets, x.shape[2])

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Π x = Pᵀ diag(1/c) P x along the token axis: (B, N, D) -> (B, N, D), same dtype."""
        b, n, d = x.shape
        index = self._flat_index()
        y = self._sketch_flat(x, index)  # (B·K', D) bucket sums
        weight = self.s / self.counts.gather(1, self.h)  # (B, N): s_j / c_{h_j}, never 1/0
        return y.index_select(0, index).view(b, n, d) * weight.to(x.dtype).unsqueeze(-1)

    def complement(self, x: torch.Tensor) -> torch.Tensor:
        """(I − Π) x."""
        return x - self.project(x)

    def matrix(self) -> torch.Tensor:
        """P as dense (B, K', N) float32 matrices, for tests and pictures only."""
        b, n = self.h.shape
        p = torch.zeros(b, self.n_buckets, n, dtype=torch.float32, device=self.h.device)
        return p.scatter_(1, self.h.unsqueeze(1), self.s.float().unsqueeze(1))

    def dense(self) -> torch.Tensor:
        """Π as dense (B, N, N) float32 matrices, for tests and pictures only."""
        p = self.matrix()
        inv_c = torch.where(self.counts > 0, 1.0 / self.counts.clamp(min=1), torch.zeros_like(self.counts))
        return p.transpose(1, 2) @ (inv_c.float().unsqueeze(-1) * p)


def draw_sketch(
    batch_size: int,
    n_tokens: int,
    rho: float,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    hashing: str = "balanced",
) -> Sketch:
    """Draw one count sketch per image on ``device`` from ``generator``.

    ``balanced``: a random permutation of the tokens, the token at rank k goes to bucket k mod K'
    (bucket sizes differ by at most one, as in the paper's code). ``uniform``: h_j i.i.d. uniform.
    """
    k = n_buckets_for(n_tokens, rho)
    if hashing not in HASHINGS:
        raise ConfigError(f"hashing={hashing!r}: choose one of {', '.join(HASHINGS)}")
    if generator is not None and device is None:
        device = generator.device
    shape = (batch_size, n_tokens)
    if hashing == "balanced":
        perm = torch.rand(shape, generator=generator, device=device).argsort(dim=1)
        buckets = (torch.arange(n_tokens, device=device) % k).expand(shape)
        h = torch.empty(shape, dtype=torch.int64, device=device).scatter_(1, perm, buckets)
    else:
        h = torch.randint(0, k, shape, generator=generator, device=device)
    s = torch.randint(0, 2, shape, generator=generator, device=device).float().mul_(2).sub_(1)
    counts = torch.zeros(batch_size, k, device=device).scatter_add_(1, h, torch.ones(shape, device=device))
    return Sketch(h=h, s=s, n_buckets=k, counts=counts)
