"""How a training step runs fast on a GPU without changing what it computes: the speed options of ``SpeedOptions``
(``ropim.train.job.JobConfig``) as the loop and the tasks apply them. ``bench/gpu_step.py`` measures each one."""

from __future__ import annotations

import contextlib
import functools
import platform
from collections.abc import Iterator
from pathlib import Path

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


def side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A CUDA stream of its own on ``device`` for work beside training's (None on a CPU), which starts after what the
    calling thread's stream holds now: weights written by training's kernels, or a copy of them still in flight."""
    if device.type != "cuda":
        return None
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    return stream


def grads_in_weight_strides(model: torch.nn.Module) -> None:
    """Each gradient of a weight with a size-1 dimension (a 1×1 convolution's) takes its weight's strides. Such
    strides are free to differ in size-1 dimensions, over the same memory: oneDNN's bf16 backward returns 1×1 kernels'
    gradients in channels_last strides, and DDP, which compares every stride with its bucket view's, warned "Grad
    strides do not match bucket view strides" on every worker (UperNet's decoder)."""
    for p in model.parameters():
        if p.requires_grad and p.dim() > 1 and 1 in p.shape:
            p.register_hook(functools.partial(in_strides_of, p))


def in_strides_of(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` viewed with ``param``'s strides when they differ in size-1 dimensions only (the same elements)."""
    same = all(a == b or n == 1 for a, b, n in zip(grad.stride(), param.stride(), grad.shape, strict=True))
    return grad.as_strided(param.shape, param.stride()) if same and grad.stride() != param.stride() else grad


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


@functools.cache
def cpu_features() -> dict:
    """This machine's CPU model and instruction flags that decide its fastest precision (Linux ``/proc/cpuinfo``;
    elsewhere none are known). Without native bf16 (AVX512-BF16 or AMX-BF16), bf16 matmuls run in fallback kernels
    many times slower than fp32 (``bench/cpu_step.py --profile``)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    found = {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16")}
    return {"model": model, **found, "native_bf16": found["avx512_bf16"] or found["amx_bf16"]}


def resolve_precision(precision: str, device: torch.device) -> str:
    """``precision`` with ``auto`` decided for ``device``: bf16 on a CPU with native bf16 instructions, else fp32
    (on CUDA too, until a GPU measurement in ``bench/results`` says otherwise)."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cpu" and cpu_features()["native_bf16"] else "fp32"


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of ``precision`` (None for fp32)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def grad_scaler(precision: str) -> torch.amp.GradScaler | None:
    """A CUDA grad scaler for fp16, else None."""
    return torch.amp.GradScaler("cuda") if precision == "fp16" else None
