"""MoCo v3 (Chen, Xie & He, ICCV 2021) around a ropim encoder, as Layer Grafted Pre-training (LGP; Jiang et al.,
ICLR 2023) trains a MIM-pretrained encoder further: the second stage of LGP-ROPIM.

    x1, x2 (B, C, H, W): two augmented views of the same images
    q_i = predictor(projector(encoder(x_i)))                          (B, dim), with gradient
    k_i = momentum_projector(momentum_encoder(x_i))                   (B, dim), no gradient
    loss = ctr(q1, k2) + ctr(q2, k1)
    ctr(q, k) = 2τ · CE(q̂ K̂ᵀ / τ, own index)   q̂, k̂ ℓ2-normalised; K = the keys of every worker (gathered)

The momentum branch is an exponential moving average of the encoder and projector, updated once per optimizer step
before the keys are computed: θ_k ← m θ_k + (1 − m) θ_q, with m rising from m0 to 1 on a half cosine over the run
(``ropim.core.contrastive``). ``encoder`` is the plain timm model (``ropim.core.backbone``): after training it is
the encoder that gets registered. ``lgp_param_groups`` gives LGP's layer-wise learning rates.

Pure torch + timm: no Ray, no MLflow.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ropim.core.backbone import Encoder, no_weight_decay
from ropim.core.contrastive import contrastive_loss


def moco_mlp(num_layers: int, in_dim: int, hidden_dim: int, out_dim: int, last_bn: bool = True) -> nn.Sequential:
    """MoCo v3's MLP: Linear (no bias) → BN → ReLU for every hidden layer, a last Linear (no bias) followed by a BN
    without affine parameters when ``last_bn``. ViT: projector 3 layers, predictor 2 layers, both with ``last_bn``."""
    layers: list[nn.Module] = []
    for i in range(num_layers):
        d_in = in_dim if i == 0 else hidden_dim
        d_out = out_dim if i == num_layers - 1 else hidden_dim
        layers.append(nn.Linear(d_in, d_out, bias=False))
        if i < num_layers - 1:
            layers += [nn.BatchNorm1d(d_out), nn.ReLU(inplace=True)]
        elif last_bn:
            layers.append(nn.BatchNorm1d(d_out, affine=False))
    return nn.Sequential(*layers)


class MoCo(nn.Module):
    """A timm encoder with MoCo v3's projector, predictor and momentum branch."""

    def __init__(self, encoder: Encoder, dim: int = 256, mlp_dim: int = 4096, temperature: float = 0.2,
                 freeze_patch_embed: bool = False) -> None:
        super().__init__()
        self.temperature = temperature
        self.encoder = encoder
        if freeze_patch_embed:  # MoCo v3's stability fix for ViT: the patch projection is not trained
            encoder.patch_embed.requires_grad_(False)
        self.projector = moco_mlp(3, encoder.embed_dim, mlp_dim, dim)
        self.predictor = moco_mlp(2, dim, mlp_dim, dim)
        self.momentum_encoder = copy.deepcopy(encoder).requires_grad_(False)
        self.momentum_projector = copy.deepcopy(self.projector).requires_grad_(False)

    def online_params(self) -> list[nn.Parameter]:
        """The parameters the momentum branch follows: the encoder's, then the projector's."""
        return [*self.encoder.parameters(), *self.projector.parameters()]

    def momentum_params(self) -> list[nn.Parameter]:
        """The momentum branch's parameters, in the order of ``online_params``."""
        return [*self.momentum_encoder.parameters(), *self.momentum_projector.parameters()]

    @torch.no_grad()
    def update_momentum(self, m: float) -> None:
        """θ_k ← m θ_k + (1 − m) θ_q over every parameter of the momentum branch (buffers, e.g. BN statistics, are
        the branch's own)."""
        for p_k, p_q in zip(self.momentum_params(), self.online_params(), strict=True):
            p_k.mul_(m).add_(p_q.detach(), alpha=1.0 - m)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """The symmetric loss of two views (B, C, H, W) each; the momentum update is the caller's
        (``update_momentum``, once per optimizer step, before this)."""
        q1 = self.predictor(self.projector(self.encoder(x1)))  # (B, dim)
        q2 = self.predictor(self.projector(self.encoder(x2)))
        with torch.no_grad():
            k1 = self.momentum_projector(self.momentum_encoder(x1))  # (B, dim)
            k2 = self.momentum_projector(self.momentum_encoder(x2))
        return contrastive_loss(q1, k2, self.temperature) + contrastive_loss(q2, k1, self.temperature)


def block_of(name: str) -> int | None:
    """The block index of an encoder parameter name (``blocks.3.attn.qkv.weight`` → 3); -1 for what comes before
    the blocks (patch embedding, cls / register tokens, position embedding, a shared relative position bias); None
    for what comes after (the final norm, pooling norm, head)."""
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    if name.startswith(("patch_embed", "cls_token", "reg_token", "pos_embed", "rel_pos_bias")):
        return -1
    return None


def lgp_param_groups(model: MoCo, lower_blocks: int, lower_lr_ratio: float, weight_decay: float) -> list[dict]:
    """LGP's layer-wise learning rates as optimizer parameter groups: the embedding and blocks 0 … ``lower_blocks``
    − 1 of the encoder at ``lower_lr_ratio`` × the rate of everything else (later blocks, final norm, projector,
    predictor), as ``lr_scale`` (timm's schedulers multiply it in). Weight decay skips 1-d parameters, tokens,
    position embeddings and relative position tables. Frozen parameters (the momentum branch, a frozen patch
    embedding) are left out."""
    skip = {f"encoder.{n}" for n in no_weight_decay(model.encoder)}
    groups: dict[tuple[str, bool], dict] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        block = block_of(name.removeprefix("encoder.")) if name.startswith("encoder.") else None
        part = "lower" if block is not None and block < lower_blocks else "upper"
        decay = p.ndim > 1 and name not in skip
        group = groups.setdefault((part, decay), {
            "name": f"{part}_{'decay' if decay else 'no_decay'}", "params": [],
            "lr_scale": lower_lr_ratio if part == "lower" else 1.0, "weight_decay": weight_decay if decay else 0.0})
        group["params"].append(p)
    return list(groups.values())
