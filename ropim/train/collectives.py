"""Values gathered (or summed) over the job's process group (``torch.distributed``, initialised by Ray Train or by a
test's gloo group): what a ``Worker``'s ``gather``, ``gather_to_first`` and ``summed`` do on more than one worker."""

from __future__ import annotations

import torch


def gathered(values: torch.Tensor, world: int, device: torch.device) -> torch.Tensor:
    """Every worker's ``values`` (the same shape on each) stacked (world, …) on CPU, on every worker; on a GPU the
    exchange runs on ``device`` (NCCL takes CUDA tensors only)."""
    if world == 1:
        return values.unsqueeze(0)
    moved = values.to(device) if device.type == "cuda" else values
    out = [torch.zeros_like(moved) for _ in range(world)]
    torch.distributed.all_gather(out, moved)
    return torch.stack([t.cpu() for t in out])


def gathered_on_first(values: torch.Tensor, rank: int, world: int, device: torch.device) -> torch.Tensor | None:
    """``gathered`` onto rank 0 alone; the other ranks get None and never hold the others' values."""
    if world == 1:
        return values.unsqueeze(0)
    moved = values.to(device) if device.type == "cuda" else values
    out = [torch.zeros_like(moved) for _ in range(world)] if rank == 0 else None
    torch.distributed.gather(moved, out, dst=0)
    return torch.stack([t.cpu() for t in out]) if out is not None else None


def summed(values: torch.Tensor, world: int, device: torch.device) -> torch.Tensor:
    """Every worker's ``values`` summed, on CPU, on every worker: one tensor's size on the wire, where ``gathered``
    then a sum holds world of them (a 1,000-class confusion matrix: 8 MB each, 512 MB on 64 workers)."""
    if world == 1:
        return values.clone()
    moved = (values.to(device) if device.type == "cuda" else values).clone()
    torch.distributed.all_reduce(moved, op=torch.distributed.ReduceOp.SUM)
    return moved.cpu()
