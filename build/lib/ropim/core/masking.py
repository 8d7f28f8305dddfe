"""SimMIM masking: a random share of mask units (squares of whole patches) hidden per image.

Masking is an orthogonal projection too (Π = diag(1 − m)), so pictures and losses treat it like a sketch.
Pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PatchMask:
    """A batch of SimMIM masks: which mask units, hence which patches, are hidden in each image.

    ``project`` keeps the visible tokens (Π = diag(1 − m)), ``complement`` keeps the masked ones (I − Π = diag(m)).
    """

    units: torch.Tensor  # (B, U) bool, True = masked unit, row-major over the unit grid
    mask: torch.Tensor  # (B, N) bool, True = masked patch, in patch_embed's token order

    @property
    def n_tokens(self) -> int:
        return self.mask.shape[1]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The visible tokens of x (B, N, D); masked rows zeroed."""
        return x.masked_fill(self.mask.unsqueeze(-1), 0)

    def complement(self, x: torch.Tensor) -> torch.Tensor:
        """The masked tokens of x (B, N, D); visible rows zeroed."""
        return x.masked_fill(~self.mask.unsqueeze(-1), 0)


def draw_mask(
    batch_size: int,
    img_size: int,
    patch_size: int,
    mask_unit: int,
    n_masked: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> PatchMask:
    """Hide exactly ``n_masked`` random mask units (``mask_unit`` px squares) per image, drawn from ``generator``."""
    if generator is not None and device is None:
        device = generator.device
    side, scale = img_size // mask_unit, mask_unit // patch_size
    ranks = torch.rand(batch_size, side * side, generator=generator, device=device).argsort(dim=1).argsort(dim=1)
    units = ranks < n_masked  # (B, U): the n_masked units with the smallest random keys
    grid = units.view(batch_size, side, side)
    patches = grid.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)  # (B, g, g)
    return PatchMask(units=units, mask=patches.reshape(batch_size, -1))
