"""bench/cpu_step.py's FLOP accounting: the peak it reads from a CPU's vendor, ISA flags and clock, and the FLOPs it
counts for a step (the CPU flash attention kernel included)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support import bench_module


@pytest.fixture(scope="module")
def cs():
    with bench_module("cpu_step") as module:
        yield module


ZEN4 = {"vendor_id": "AuthenticAMD", "flags": "fma avx2 avx512f avx512_bf16", "cpu MHz": "2596.150"}
SPR = {"vendor_id": "GenuineIntel", "flags": "fma avx2 avx512f avx512_bf16 amx_bf16", "cpu MHz": "2000.0",
       "lscpu CPU max MHz": "3800.0000"}
AVX2 = {"vendor_id": "GenuineIntel", "flags": "fma avx2", "cpu MHz": "3000.0"}


@pytest.mark.parametrize(("info", "fp32", "bf16", "ghz"), [(ZEN4, 32, 64, 2.59615), (SPR, 64, 2048, 3.8),
                                                            (AVX2, 32, 32, 3.0)])
def test_peak_from_vendor_flags_and_clock(cs, monkeypatch, info, fp32, bf16, ghz):
    """FLOPs per cycle per core: 2 × FMA lanes; the clock from lscpu's max MHz, else /proc/cpuinfo's cpu MHz."""
    monkeypatch.setattr(cs, "cpu_info", lambda: info)
    monkeypatch.setattr(cs.os, "cpu_count", lambda: 16)
    peak = cs.peak_flops(threads=2)
    assert peak["clock_ghz"] == pytest.approx(ghz)
    assert peak["fp32"] == pytest.approx(2 * fp32 * ghz * 1e9)
    assert peak["bf16"] == pytest.approx(2 * bf16 * ghz * 1e9)
    given = cs.peak_flops(threads=64, clock_ghz=3.6)  # at most one thread per core; a measured clock wins
    assert given["cores"] == 16 and given["fp32"] == pytest.approx(16 * fp32 * 3.6e9)
    assert "given with --clock-ghz" in given["how"]


def test_counted_flops_include_the_cpu_flash_attention(cs):
    """A linear layer and an attention, forward and backward: 3 × the forward matmuls, 2.5 × the attention's."""
    b, h, t, d = 2, 3, 16, 8
    w = torch.randn(d, d, requires_grad=True)
    q = torch.randn(b, h, t, d, requires_grad=True)

    def step() -> None:
        x = q @ w
        F.scaled_dot_product_attention(x, x, x).sum().backward()

    linear = 2 * b * h * t * d * d
    attention = 2 * (2 * b * h * t * t * d)  # q·kᵀ and p·v; the backward recomputes q·kᵀ and makes 4 products
    assert cs.count_flops(step) == 3 * linear + attention + 5 * attention // 2
