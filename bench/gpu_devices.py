"""What ``gpu_step.py`` needs to know about a device: its dense bf16 peak (for MFU) and which options it runs."""

from __future__ import annotations

import platform
import re

import torch

# Dense bf16 tensor-core peaks in TFLOP/s; the first pattern matching the CUDA device name wins. NVIDIA's data
# sheets quote "with sparsity" figures: dense is half.
PEAKS: list[tuple[str, float, str]] = [
    (r"H100.*PCIe", 756.0, "NVIDIA H100 datasheet, PCIe: 1,513 sparse / 2"),
    (r"H100.*NVL", 835.0, "NVIDIA H100 datasheet, NVL: 1,671 sparse / 2"),
    (r"H100", 989.4, "NVIDIA H100 datasheet, SXM: 1,979 sparse / 2"),
    (r"H200.*NVL", 835.0, "NVIDIA H200 datasheet, NVL: 1,671 sparse / 2"),
    (r"H200", 989.4, "NVIDIA H200 datasheet, SXM: 1,979 sparse / 2"),
    (r"A100", 312.0, "NVIDIA A100 datasheet: 312 dense"),
    (r"A10G", 125.0, "NVIDIA A10 datasheet, 250 sparse / 2 (AWS's A10G)"),
    (r"\bL4\b", 121.0, "NVIDIA L4 datasheet, 242 sparse / 2"),
    (r"RTX 4090", 165.2, "NVIDIA Ada whitepaper, RTX 4090 bf16 with fp32 accumulate: 330.3 sparse / 2"),
]


def device_info(device: torch.device) -> tuple[str, float | None, str]:
    """(device name, dense bf16 peak TFLOP/s or None, where the peak comes from)."""
    if device.type != "cuda":
        return f"cpu: {platform.processor() or platform.machine()}", None, "no peak table for CPUs: MFU unknown"
    name = torch.cuda.get_device_name(device)
    for pattern, peak, source in PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            return name, peak, source
    return name, None, f"{name!r} is not in the peak table: MFU unknown"


def unsupported(device: torch.device) -> dict[str, str]:
    """Why each option cannot run on ``device`` (options that run are absent)."""
    why = {}
    try:
        torch.optim.AdamW([torch.zeros(1, device=device, requires_grad=True)], fused=True)
    except (RuntimeError, ValueError) as e:
        why["fused"] = f"fused AdamW unsupported on {device.type}: {e}"
    if device.type != "cuda":
        why["pageable"] = why["pinned"] = "host-to-device copies: CUDA only"
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 0):
        why["tf32"] = "TF32 is a CUDA matmul mode of Ampere and newer GPUs"
    elif not torch.cuda.is_bf16_supported():
        why["bf16"] = "bf16 unsupported on this GPU"
    return why
