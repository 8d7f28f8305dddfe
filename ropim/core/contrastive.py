"""MoCo v3's contrastive loss and momentum schedule, torch only (no timm): the keys of every worker gathered
without gradient (``torch.distributed``, when it is initialised), the loss of this worker's queries against them.

    ctr(q, k) = 2τ · CE(q̂ K̂ᵀ / τ, own index)     q̂, k̂ ℓ2-normalised, K̂ the keys of all workers
    m_k = 1 − (1 − m0)(cos(π k / K) + 1) / 2      the momentum at optimizer step k of K
"""

from __future__ import annotations

import math

import torch
from torch import nn


def momentum_at(step: int, total_steps: int, base: float, cosine: bool = True) -> float:
    """The EMA momentum at optimizer step ``step`` (0-based) of ``total_steps``: 1 − (1 − m0)(cos(π k/K) + 1)/2,
    m0 = ``base`` at the first step and 1 at the end; ``base`` throughout without ``cosine``."""
    if not cosine:
        return base
    return 1.0 - (1.0 - base) * (math.cos(math.pi * step / max(total_steps, 1)) + 1.0) / 2.0


@torch.no_grad()
def gather_keys(k: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the keys of every worker (world·B, dim), the index of this worker's first key); without gradient, as keys
    need none. Without torch.distributed (one process) the keys are this worker's own."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return k, 0
    world = torch.distributed.get_world_size()
    if world == 1:
        return k, 0
    out = [torch.empty_like(k) for _ in range(world)]
    torch.distributed.all_gather(out, k.contiguous())
    return torch.cat(out), torch.distributed.get_rank() * k.shape[0]


def contrastive_loss(q: torch.Tensor, k: torch.Tensor, temperature: float) -> torch.Tensor:
    """2τ · cross-entropy of the cosine similarities of queries q (B, dim) to the keys of every worker, divided by
    τ; the positive of query i is this worker's key i. Computed in fp32, also inside the loop's bf16 / fp16 autocast
    (whose matmul would round the logits: a step of 0.03 near 5 in bf16)."""
    with torch.autocast(q.device.type, enabled=False):
        q = nn.functional.normalize(q.float(), dim=1)
        k = nn.functional.normalize(k.float(), dim=1)
        keys, offset = gather_keys(k)  # (world·B, dim)
        logits = q @ keys.T / temperature  # (B, world·B)
        labels = torch.arange(q.shape[0], device=q.device) + offset
        return nn.functional.cross_entropy(logits, labels) * (2 * temperature)
