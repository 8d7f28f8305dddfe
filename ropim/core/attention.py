"""How ropim's ``beit`` blocks attend on CPU: timm's Beit block with its attention written out, so that a bias that
needs a gradient does not send ``F.scaled_dot_product_attention`` to torch's slow math kernel
(``ropim.core.backbone`` picks it). Pure torch + timm: no Ray, no MLflow.
"""

from __future__ import annotations

import torch
from timm.models.beit import Block as BeitBlock
from torch.nn import functional as F


def beit_block_unfused(blk: BeitBlock, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """timm's Beit ``Block.forward`` with a shared relative position ``bias`` (heads, T, T), its attention written as
    timm's unfused path and the paper's code compute it: softmax(q·kᵀ/√d + bias)·v, the product in the autocast
    dtype, the sum with the fp32 bias and the softmax in fp32. On CPU, timm's fused path
    (``F.scaled_dot_product_attention`` with a bias that needs a gradient) falls back to torch's math kernel, which
    upcasts bf16 q, k, v to fp32 and scans each row for -inf (``aten::all``): about twice this path's time under
    bf16 autocast, a little more in fp32 (``bench/cpu_step.py``). Elsewhere timm's own block runs."""
    a = blk.attn
    h = blk.norm1(x)
    b, t, c = h.shape
    qkv_bias = torch.cat((a.q_bias, a.k_bias, a.v_bias)) if a.q_bias is not None else None
    qkv = F.linear(h, a.qkv.weight, qkv_bias).reshape(b, t, 3, a.num_heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)  # (B, heads, T, head_dim)
    attn = a.attn_drop(((q * a.scale) @ k.transpose(-2, -1) + bias).softmax(dim=-1))  # (B, heads, T, T)
    h = a.proj_drop(a.proj((attn @ v).transpose(1, 2).reshape(b, t, c)))
    x = x + blk.drop_path1(h if blk.gamma_1 is None else blk.gamma_1 * h)
    h = blk.mlp(blk.norm2(x))
    return x + blk.drop_path2(h if blk.gamma_2 is None else blk.gamma_2 * h)
