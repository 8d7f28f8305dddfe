"""ROPIM model: timm ViT encoder, random orthogonal projection of the patch embeddings, linear decoder.

    imgs (B, C, H, W) ─ patch_embed ─> Φ (B, N, D) ─ Π ─> Φ' ─ +cls, +pos ─> blocks ─> norm
        ─ drop cls ─> (B, N, D) ─ decoder ─> X̃ (B, N, p²C)
    loss = mean |(I − Π)(X − X̃)|        X = patchify(imgs), the normalized pixels of each patch

``corruption`` selects what happens between patch_embed and cls/pos: ``rop`` (the above), ``mask``
(SimMIM: a random share of mask units — squares of whole patches — has its embeddings replaced by a
learnable mask token; loss = mean |X − X̃| over the elements of masked patches) or ``none`` (plain
reconstruction). Encoder, decoder, optimizer and data path are the same for all three.

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
CORRUPTIONS = ("rop", "mask", "none")
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
    mask_ratio: float = 0.6  # corruption="mask": share of mask units hidden per image (SimMIM's 0.6)
    mask_patch_size: int | None = None  # mask unit in pixels; None: 32 px at 224², scaled (see mask_unit)

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
        self._validate_mask()
        return self

    def _validate_mask(self) -> None:
        if not (isinstance(self.mask_ratio, (int, float)) and 0.0 < self.mask_ratio < 1.0):
            raise ConfigError(
                f"mask_ratio={self.mask_ratio!r}: the share of masked units must satisfy 0 < mask_ratio < 1 "
                "(SimMIM's default is 0.6)"
            )
        m, p = self.mask_patch_size, self.patch_size
        if m is not None and (m <= 0 or m % p or self.img_size % m):
            raise ConfigError(
                f"mask_patch_size={m}: the mask unit must be a multiple of patch_size={p} that divides "
                f"img_size={self.img_size} (or null for the default, {default_mask_unit(self.img_size, p)} here)"
            )
        n_units, n_masked = self.n_mask_units, self.n_masked_units
        if not 1 <= n_masked <= n_units - 1:
            raise ConfigError(
                f"mask_ratio={self.mask_ratio}: masks {n_masked} of {n_units} mask units; at least one unit must "
                "be masked and one visible (raise/lower mask_ratio or use a smaller mask_patch_size)"
            )

    @property
    def n_tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2

    @property
    def mask_unit(self) -> int:
        """Side of a mask unit in pixels: ``mask_patch_size`` or the scaled default (``default_mask_unit``)."""
        return self.mask_patch_size or default_mask_unit(self.img_size, self.patch_size)

    @property
    def n_mask_units(self) -> int:
        return (self.img_size // self.mask_unit) ** 2

    @property
    def n_masked_units(self) -> int:
        """Units masked per image: exactly round(mask_ratio × units) (Python's round)."""
        return round(self.mask_ratio * self.n_mask_units)


def default_mask_unit(img_size: int, patch_size: int) -> int:
    """SimMIM's 32-px mask unit at 224², scaled to ``img_size``: img_size·32/224 rounded to a multiple of
    ``patch_size`` (at least one patch) that divides ``img_size``; 32 at 224/16, 4 at 32/4, 8 at 64/8.
    """
    target = img_size * 32 / 224
    grid = img_size // patch_size
    sizes = [k * patch_size for k in range(1, grid + 1) if grid % k == 0]
    return min(sizes, key=lambda u: (abs(u - target), u))


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


@dataclass(frozen=True)
class PatchMask:
    """A batch of SimMIM masks: which mask units, hence which patches, are hidden in each image.

    Masking is an orthogonal projection too: ``project`` keeps the visible tokens (Π = diag(1 − m)),
    ``complement`` keeps the masked ones (I − Π = diag(m)), so pictures treat ROP and masks alike.
    """

    units: torch.Tensor  # (B, U) bool, True = masked unit, row-major over the unit grid
    mask: torch.Tensor  # (B, N) bool, True = masked patch, in patch_embed's token order

    @property
    def n_tokens(self) -> int:
        return self.mask.shape[1]

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The visible tokens of x (B, N, D); masked rows zeroed."""
        return x.masked_fill(self.mask.unsqueeze(-1), 0)

    def complement(self, x: torch.Tensor) -> torch.Tensor:
        """The masked tokens of x (B, N, D); visible rows zeroed."""
        return x.masked_fill(~self.mask.unsqueeze(-1), 0)


def draw_mask(
    batch_size: int,
    img_size: int,
    patch_size: int,
    mask_unit: int,
    n_masked: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> PatchMask:
    """Hide exactly ``n_masked`` random mask units (``mask_unit`` px squares) per image, drawn from ``generator``."""
    if generator is not None and device is None:
        device = generator.device
    side, scale = img_size // mask_unit, mask_unit // patch_size
    ranks = torch.rand(batch_size, side * side, generator=generator, device=device).argsort(dim=1).argsort(dim=1)
    units = ranks < n_masked  # (B, U): the n_masked units with the smallest random keys
    grid = units.view(batch_size, side, side)
    patches = grid.repeat_interleave(scale, dim=1).repeat_interleave(scale, dim=2)  # (B, g, g)
    return PatchMask(units=units, mask=patches.reshape(batch_size, -1))


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
            nn.init.trunc_normal_(self.mask_token, mean=0.0, std=0.02)

    def no_weight_decay(self) -> set[str]:
        """Full names of the parameters kept out of weight decay (timm's create_optimizer_v2 reads this):
        the encoder's position embedding and cls token, and the mask token. Norms and biases are excluded
        by timm anyway (1-d parameters).
        """
        names = {name for name, _ in self.named_parameters()}
        wanted = {f"encoder.{n}" for n in self.encoder.no_weight_decay()} | {"mask_token"}
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
            hashing=self.cfg.hashing,
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
        x = enc._pos_embed(x)  # (B, 1 + N, D): cls token + position embedding
        x = enc.patch_drop(x)
        x = enc.norm_pre(x)
        x = enc.blocks(x)
        x = enc.norm(x)
        x = x[:, enc.num_prefix_tokens :]  # (B, N, D)
        return self.decoder(x)  # (B, N, p²C)

    def loss(self, imgs: torch.Tensor, pred: torch.Tensor, sketch: Corruption) -> torch.Tensor:
        """Mean ℓ1 (or squared ℓ2) of (I − Π)(X − X̃); of X − X̃ when there is no sketch; for a PatchMask,
        of X − X̃ over the elements of the masked patches only (visible patches do not count)."""
        diff = patchify(imgs, self.cfg.patch_size) - pred  # (B, N, p²C)
        if isinstance(sketch, PatchMask):
            diff = diff[sketch.mask]  # (masked patches, p²C)
        elif sketch is not None:
            diff = sketch.complement(diff)
        return diff.abs().mean() if self.cfg.loss == "l1" else diff.pow(2).mean()

    def forward(
        self, imgs: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Corruption]:
        """(loss, X̃, corruption) for a batch of normalized images (B, C, H, W); the corruption (Sketch,
        PatchMask or None) is drawn from ``generator``."""
        sketch = self.draw_corruption(imgs.shape[0], generator)
        pred = self.reconstruct(imgs, sketch)
        return self.loss(imgs, pred, sketch), pred, sketch


def config_dict(cfg: ModelConfig) -> dict:
    """The JSON-ready form of a ModelConfig."""
    return asdict(cfg)
