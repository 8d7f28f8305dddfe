"""`model.init: official`: a fresh `beit` encoder drawn as the paper's code draws it (csiro-robotics/ROPIM
`models/ropim.py` over BEiT's scheme): weights of every Linear and of the patch embedding, and the cls token, from
N(0, 0.02²) cut at ±0.02 (±1σ), biases 0, block l's attn.proj and mlp.fc2 divided by √(2l). timm's own init (the
default, kept for old configs and the CPU presets) cuts at ±2, so its std is 0.02."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM

STD = 0.02
# N(0, σ²) cut at ±σ: variance σ²·(1 − 2φ(1) / (2Φ(1) − 1)), φ the standard normal density, 2Φ(1) − 1 = erf(1/√2)
CUT_STD = STD * math.sqrt(1 - 2 * math.exp(-0.5) / math.sqrt(2 * math.pi) / math.erf(1 / math.sqrt(2)))
DEPTH = 12


def fresh(init: str, **changes) -> ROPIM:
    torch.manual_seed(0)
    cfg = ModelConfig(backbone="beit", init=init, img_size=32, patch_size=16, **changes)  # ViT-T width, 12 blocks
    return ROPIM(cfg)


def unscaled(enc: nn.Module) -> list[torch.Tensor]:
    """The weights drawn at std 0.02 and left so: qkv, fc1, patch embedding, cls token."""
    blocks = [t for blk in enc.blocks for t in (blk.attn.qkv.weight, blk.mlp.fc1.weight)]
    return [*blocks, enc.patch_embed.proj.weight, enc.cls_token]


def test_official_init_is_the_papers_truncated_normal():
    assert round(CUT_STD, 5) == 0.01079
    enc = fresh("official").encoder
    drawn = torch.cat([t.detach().flatten() for t in unscaled(enc)])  # 3.7 M values
    assert drawn.abs().max() <= STD
    assert drawn.std().item() == pytest.approx(CUT_STD, rel=0.01)
    assert drawn.mean().abs() < 1e-4
    for layer, blk in enumerate(enc.blocks, start=1):  # BEiT's fix_init_weight
        for w in (blk.attn.proj.weight, blk.mlp.fc2.weight):
            scale = math.sqrt(2.0 * layer)
            assert w.abs().max() <= STD / scale * (1 + 1e-6)
            assert w.std().item() == pytest.approx(CUT_STD / scale, rel=0.03)
    biases = [m.bias for m in enc.modules() if isinstance(m, nn.Linear | nn.Conv2d) and m.bias is not None]
    biases += [t for blk in enc.blocks for t in (blk.attn.q_bias, blk.attn.v_bias)]
    assert len(biases) == 3 * DEPTH + 1 + 2 * DEPTH and all(torch.all(b == 0) for b in biases)
    assert torch.all(enc.rel_pos_bias.relative_position_bias_table == 0)
    assert all(torch.all(blk.gamma_1 == 0.1) and torch.all(blk.gamma_2 == 0.1) for blk in enc.blocks)
    norms = [m for m in enc.modules() if isinstance(m, nn.LayerNorm)]
    assert all(torch.all(m.weight == 1) and torch.all(m.bias == 0) for m in norms)


def test_timm_init_is_about_twice_as_wide_and_stays_the_default():
    assert ModelConfig().init == "timm"
    enc = fresh("timm").encoder
    blocks = torch.cat([t.detach().flatten() for blk in enc.blocks for t in (blk.attn.qkv.weight, blk.mlp.fc1.weight)])
    assert blocks.std().item() == pytest.approx(STD, rel=0.01)  # cut at ±2 (absolute): no cut at all
    assert blocks.abs().max() > 3 * STD
    assert torch.any(enc.patch_embed.proj.bias != 0)  # torch's default for the convolution


def test_official_mask_token_is_simmims():
    assert fresh("official", corruption="mask", depth=1).mask_token.abs().max() <= STD
    assert fresh("timm", corruption="mask", depth=1).mask_token.abs().max() > STD
