"""How a training step runs fast on a GPU without changing what it computes: the speed options of ``SpeedOptions``
(``ropim.train.speed_options``) as the loop and the tasks apply them. ``bench/gpu_step.py`` measures each one."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def adamw_kernels(kind: str) -> dict[str, bool]:
    """``torch.optim.AdamW`` keyword arguments of ``SpeedOptions.adamw``: {} keeps torch's choice (foreach on CUDA,
    a loop over the parameters on CPU), ``foreach`` batches the update over tensors, ``fused`` runs one kernel."""
    return {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[kind]


def images_to(x: torch.Tensor, device: torch.device, channels_last: bool = False, non_blocking: bool = True
              ) -> torch.Tensor:
    """A batch of images on ``device``, NHWC when ``channels_last``; ``non_blocking`` lets a copy from pinned memory
    overlap with the GPU's work (from pageable memory it is an ordinary copy)."""
    x = x.to(device, non_blocking=non_blocking)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """CUDA fp32 matmuls on TF32 tensor cores while the block runs (the process's setting restored after)."""
    saved = torch.get_float32_matmul_precision()
    if enabled:
        torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)
