"""ROPIM model: a timm encoder (``vit`` or the paper's ``beit``), random orthogonal projection of the patch
embeddings, linear decoder.

    imgs (B, C, H, W) ─ patch_embed ─> Φ (B, N, D) ─ Π ─> Φ' ─ +cls (+pos for vit) ─> blocks ─> norm
        ─ drop cls ─> (B, N, D) ─ decoder ─> X̃ (B, N, p²C)
    loss = mean |(I − Π)(X − X̃)|        X = patchify(imgs), the normalized pixels of each patch

``corruption`` selects what happens between patch_embed and cls/pos: ``rop`` (the above), ``mask``
(SimMIM: a random share of mask units — squares of whole patches — has its embeddings replaced by a
learnable mask token; loss = mean |X − X̃| over the elements of masked patches) or ``none`` (plain
reconstruction). Encoder, decoder, optimizer and data path are the same for all three.

Pure torch + timm: no Ray, no MLflow. The encoder is a plain timm model that
``timm.create_model(*encoder_spec(cfg))`` rebuilds exactly (``ropim.core.backbone``).
"""

from __future__ import annotations

import torch
from torch import nn

from ropim.core import backbone
from ropim.core.config import ModelConfig
from ropim.core.masking import PatchMask, draw_mask
from ropim.core.sketch import Sketch, draw_sketch


def encoder_spec(cfg: ModelConfig) -> tuple[str, dict]:
    """(timm name, kwargs) that rebuild the encoder with ``timm.create_model`` alone (stored when registered)."""
    return backbone.encoder_spec(cfg.backbone, cfg.arch, img_size=cfg.img_size, patch_size=cfg.patch_size,
                                 in_chans=cfg.in_chans, depth=cfg.depth, drop_path_rate=cfg.drop_path_rate)


def create_encoder(cfg: ModelConfig, **overrides) -> backbone.Encoder:
    """A randomly initialised encoder of ``cfg``'s backbone, initialised as ``cfg.init`` says; never downloads."""
    encoder = backbone.create_encoder(*encoder_spec(cfg), **overrides)
    return backbone.official_init_(encoder) if cfg.init == "official" else encoder


def patchify(imgs: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, p²·C), rows in patch_embed's token order, pixels as (p, p, C)."""
    b, c, h, w = imgs.shape
    p = patch_size
    x = imgs.reshape(b, c, h // p, p, w // p, p)
    return torch.einsum("bchpwq->bhwpqc", x).reshape(b, (h // p) * (w // p), p * p * c)


def unpatchify(x: torch.Tensor, patch_size: int, channels: int = 3) -> torch.Tensor:
    """(B, N, p²·C) -> (B, C, H, W), the inverse of ``patchify`` for square images."""
    b, n, _ = x.shape
    p, g = patch_size, int(n**0.5)
    x = x.reshape(b, g, g, p, p, channels)
    return torch.einsum("bhwpqc->bchpwq", x).reshape(b, channels, g * p, g * p)


Corruption = Sketch | PatchMask | None


class ROPIM(nn.Module):
    """Encoder + linear decoder trained to predict the complement of the projected patches."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        self.encoder = create_encoder(cfg)
        embed_dim = self.encoder.embed_dim
        self.decoder = nn.Linear(embed_dim, cfg.patch_size**2 * cfg.in_chans)  # the paper's 1×1 conv
        if cfg.corruption == "mask":
            # SimMIM's learnable mask token; outside self.encoder so the exported encoder state never holds it
            self.mask_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
            cut = 0.02 if cfg.init == "official" else 2.0  # SimMIM's official code cuts at ±1σ too
            nn.init.trunc_normal_(self.mask_token, mean=0.0, std=0.02, a=-cut, b=cut)

    def no_weight_decay(self) -> set[str]:
        """Full names of the parameters kept out of weight decay (timm's create_optimizer_v2 reads this):
        the encoder's tokens, position embedding and relative position bias tables, and the mask token. Norms,
        biases and layer scales are excluded by timm anyway (1-d parameters).
        """
        names = {name for name, _ in self.named_parameters()}
        wanted = {f"encoder.{n}" for n in backbone.no_weight_decay(self.encoder)} | {"mask_token"}
        return wanted & names

    def draw_corruption(self, batch_size: int, generator: torch.Generator | None = None) -> Corruption:
        """What ``cfg.corruption`` asks for: a Sketch (rop), a PatchMask (mask) or None (none)."""
        if self.cfg.corruption == "mask":
            return self.draw_mask(batch_size, generator)
        return self.draw_sketch(batch_size, generator)

    def draw_mask(self, batch_size: int, generator: torch.Generator | None = None) -> PatchMask:
        """A fresh SimMIM mask per image: exactly ``cfg.n_masked_units`` units hidden."""
        c = self.cfg
        device = generator.device if generator is not None else self.decoder.weight.device
        return draw_mask(batch_size, c.img_size, c.patch_size, c.mask_unit, c.n_masked_units,
                         generator=generator, device=device)

    def draw_sketch(self, batch_size: int, generator: torch.Generator | None = None) -> Sketch | None:
        """A fresh sketch per image, or None unless corruption is 'rop'."""
        if self.cfg.corruption != "rop":
            return None
        device = generator.device if generator is not None else self.decoder.weight.device
        return draw_sketch(
            batch_size, self.cfg.n_tokens, self.cfg.rho, generator=generator, device=device,
            hashing=self.cfg.hashing, literal_scale=self.cfg.literal_scale,
        )

    def reconstruct(self, imgs: torch.Tensor, sketch: Corruption) -> torch.Tensor:
        """Predicted patches X̃ (B, N, p²C) from images whose patch embeddings are projected by ``sketch``
        (or, for a PatchMask, whose masked patch embeddings are replaced by the mask token)."""
        enc = self.encoder
        x = enc.patch_embed(imgs)  # (B, N, D)
        if isinstance(sketch, PatchMask):
            w = sketch.mask.unsqueeze(-1).to(x.dtype)
            x = x * (1 - w) + self.mask_token.to(x.dtype) * w  # SimMIM: masked embeddings -> mask token
        elif sketch is not None:
            x = sketch.project(x)  # Φ' = Π Φ
        x = backbone.encode_patch_embeddings(enc, x)  # (B, N, D): cls + position, blocks, norm; cls dropped
        return self.decoder(x)  # (B, N, p²C)

    def loss(self, imgs: torch.Tensor, pred: torch.Tensor, sketch: Corruption) -> torch.Tensor:
        """Mean ℓ1 (or squared ℓ2) of (I − Π)(X − X̃); of X − X̃ when there is no sketch; for a PatchMask,
        of X − X̃ over the elements of the masked patches only (visible patches do not count)."""
        diff = patchify(imgs, self.cfg.patch_size) - pred  # (B, N, p²C)
        if sketch is not None:
            diff = sketch.complement(diff)
        err = diff.abs() if self.cfg.loss == "l1" else diff.pow(2)
        if isinstance(sketch, PatchMask):  # visible rows are zero: sum / elements of masked patches (no boolean
            return err.sum() / (sketch.mask.sum() * err.shape[-1])  # indexing, so torch.compile needs no graph break)
        return err.mean()

    def forward(
        self, imgs: torch.Tensor, generator: torch.Generator | None = None, corruption: Corruption = None
    ) -> tuple[torch.Tensor, torch.Tensor, Corruption]:
        """(loss, X̃, corruption) for a batch of normalized images (B, C, H, W). The corruption (Sketch, PatchMask or
        None) is ``corruption`` when given — drawn by the caller with ``draw_corruption``, e.g. outside a compiled
        forward, which then traces as one graph — else drawn here from ``generator``."""
        sketch = corruption if corruption is not None else self.draw_corruption(imgs.shape[0], generator)
        pred = self.reconstruct(imgs, sketch)
        return self.loss(imgs, pred, sketch), pred, sketch
