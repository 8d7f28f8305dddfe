"""A process of the 2-process gather test (``test_moco``): imports only torch and ``ropim.core.contrastive``, so a
spawned process starts in a second or two."""

from __future__ import annotations

import torch

from ropim.core.contrastive import contrastive_loss


def gathered_loss(rank: int, init: str, q: torch.Tensor, k: torch.Tensor, out, world: int = 2) -> None:
    """Worker ``rank`` of ``world``: the loss of its share of the queries and keys, every worker's keys gathered."""
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        n = q.shape[0] // world
        out.put((rank, contrastive_loss(q[rank * n:(rank + 1) * n], k[rank * n:(rank + 1) * n], 0.2).item()))
    finally:
        torch.distributed.destroy_process_group()
