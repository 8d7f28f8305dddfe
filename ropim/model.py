"""ROPIM model: timm ViT encoder, random orthogonal projection of the patch embeddings, linear decoder.

    imgs (B, C, H, W) ─ patch_embed ─> Φ (B, N, D) ─ Π ─> Φ' ─ +cls, +pos ─> blocks ─> norm
        ─ drop cls ─> (B, N, D) ─ decoder ─> X̃ (B, N, p²C)
    loss = mean |(I − Π)(X − X̃)|        X = patchify(imgs), the normalized pixels of each patch

Pure torch + timm: no Ray, no MLflow. The encoder is a plain timm ``VisionTransformer`` that
``timm.create_model(arch, **encoder_kwargs(...))`` rebuilds exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import timm
import torch
from torch import nn

from ropim.errors import ConfigError
from ropim.sketch import Sketch, check_rho, draw_sketch, n_buckets_for

ARCHS = ("vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224")
CORRUPTIONS = ("rop", "none")
LOSSES = ("l1", "l2")


@dataclass(frozen=True)
class ModelConfig:
    """What builds a ROPIM model; every field is a plain value so it serializes to JSON."""

    arch: str = "vit_tiny_patch16_224"
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    depth: int | None = None  # None keeps the architecture's depth
    drop_path_rate: float = 0.0
    rho: float = 1 / 7
    corruption: str = "rop"
    loss: str = "l1"
    hashing: str = "balanced"

    def validate(self) -> ModelConfig:
        """Raise ConfigError naming the bad field and its fix."""
        if self.arch not in ARCHS:
            raise ConfigError(f"arch={self.arch!r}: unknown architecture; choose one of {', '.join(ARCHS)}")
        if self.patch_size <= 0 or self.img_size % self.patch_size:
            raise ConfigError(
                f"img_size={self.img_size}, patch_size={self.patch_size}: the patch size must divide the "
                f"image size (e.g. img_size={self.img_size - self.img_size % max(self.patch_size, 1)})"
            )
        if self.corruption not in CORRUPTIONS:
            raise ConfigError(f"corruption={self.corruption!r}: choose one of {', '.join(CORRUPTIONS)}")
        if self.loss not in LOSSES:
            raise ConfigError(f"loss={self.loss!r}: choose one of {', '.join(LOSSES)}")
        check_rho(self.rho)
        n_buckets_for(self.n_tokens, self.rho)
        return self

    @property
    def n_tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2


def encoder_kwargs(cfg: ModelConfig) -> dict:
    """Keyword arguments for ``timm.create_model(cfg.arch, **kwargs)`` that rebuild the encoder.

    Average pooling over patch tokens after the final norm (``fc_norm=False`` keeps ``norm``), so the
    pretrained state dict loads unchanged into a classifier.
    """
    kwargs = dict(
        img_size=cfg.img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans,
        num_classes=0,
        global_pool="avg",
        fc_norm=False,
        drop_path_rate=cfg.drop_path_rate,
    )
    if cfg.depth is not None:
        kwargs["depth"] = cfg.depth
    return kwargs


def create_encoder(cfg: ModelConfig, **overrides) -> timm.models.VisionTransformer:
    """A randomly initialised timm ViT; never downloads weights."""
    return timm.create_model(cfg.arch, pretrained=False, **{**encoder_kwargs(cfg), **overrides})


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


class ROPIM(nn.Module):
    """Encoder + linear decoder trained to predict the complement of the projected patches."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg.validate()
        self.encoder = create_encoder(cfg)
        embed_dim = self.encoder.embed_dim
        self.decoder = nn.Linear(embed_dim, cfg.patch_size**2 * cfg.in_chans)  # the paper's 1×1 conv

    def draw_sketch(self, batch_size: int, generator: torch.Generator | None = None) -> Sketch | None:
        """A fresh sketch per image, or None when corruption is 'none'."""
        if self.cfg.corruption == "none":
            return None
        device = generator.device if generator is not None else self.decoder.weight.device
        return draw_sketch(
            batch_size, self.cfg.n_tokens, self.cfg.rho, generator=generator, device=device,
            hashing=self.cfg.hashing,
        )

    def reconstruct(self, imgs: torch.Tensor, sketch: Sketch | None) -> torch.Tensor:
        """Predicted patches X̃ (B, N, p²C) from images whose patch embeddings are projected by ``sketch``."""
        enc = self.encoder
        x = enc.patch_embed(imgs)  # (B, N, D)
        if sketch is not None:
            x = sketch.project(x)  # Φ' = Π Φ
        x = enc._pos_embed(x)  # (B, 1 + N, D): cls token + position embedding
        x = enc.patch_drop(x)
        x = enc.norm_pre(x)
        x = enc.blocks(x)
        x = enc.norm(x)
        x = x[:, enc.num_prefix_tokens :]  # (B, N, D)
        return self.decoder(x)  # (B, N, p²C)

    def loss(self, imgs: torch.Tensor, pred: torch.Tensor, sketch: Sketch | None) -> torch.Tensor:
        """Mean ℓ1 (or squared ℓ2) of (I − Π)(X − X̃); of X − X̃ when there is no sketch."""
        diff = patchify(imgs, self.cfg.patch_size) - pred  # (B, N, p²C)
        if sketch is not None:
            diff = sketch.complement(diff)
        return diff.abs().mean() if self.cfg.loss == "l1" else diff.pow(2).mean()

    def forward(
        self, imgs: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Sketch | None]:
        """(loss, X̃, sketch) for a batch of normalized images (B, C, H, W)."""
        sketch = self.draw_sketch(imgs.shape[0], generator)
        pred = self.reconstruct(imgs, sketch)
        return self.loss(imgs, pred, sketch), pred, sketch


def config_dict(cfg: ModelConfig) -> dict:
    """The JSON-ready form of a ModelConfig."""
    return asdict(cfg)
