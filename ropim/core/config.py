"""What builds a ROPIM model (``ModelConfig``) and the size arithmetic of its corruptions, without torch.

Kept free of torch so that the command line parses and validates a model config in a fraction of a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ropim.checks import COUNT, OneOf, Range, check_fields, check_value
from ropim.errors import ConfigError

# arch -> (embed_dim, num_heads) of ViT-T/S/B: the width of either backbone
WIDTHS = {
    "vit_tiny_patch16_224": (192, 3),
    "vit_small_patch16_224": (384, 6),
    "vit_base_patch16_224": (768, 12),
}
ARCHS = tuple(WIDTHS)
BACKBONES = ("vit", "beit")  # timm VisionTransformer (absolute position embedding) | the paper's BEiT-style ViT
HASHING = OneOf(("balanced", "uniform", "official"))  # official: the paper's code's buckets and signs (core.sketch)
RULES = {"img_size": COUNT, "patch_size": COUNT, "depth": Range(1, integer=True, optional=True),
         "drop_path_rate": Range(0, 1, high_open=True), "mask_patch_size": Range(1, integer=True, optional=True),
         "arch": OneOf(ARCHS), "backbone": OneOf(BACKBONES), "corruption": OneOf(("rop", "mask", "none")),
         "loss": OneOf(("l1", "l2")), "hashing": HASHING,
         # timm: timm's Beit/VisionTransformer init (weights N(0, 0.02²) cut at ±2, i.e. uncut); official: the
         # paper's code's (BEiT's trunc_normal_ cut at ±1σ, ``ropim.core.backbone.official_init_``), beit only
         "init": OneOf(("timm", "official"))}


def check_rho(rho: float) -> None:
    """Raise ConfigError (a ValueError) unless 0 < rho < 1."""
    if not (isinstance(rho, (int, float)) and 0.0 < rho < 1.0):
        raise ConfigError(f"rho={rho!r}: the sketch ratio must satisfy 0 < rho < 1 (the paper's default is 1/7)")


def n_buckets_for(n_tokens: int, rho: float) -> int:
    """K' = ceil(rho·N − 1e-6) clipped to [1, N−1]; rho = 1/7 at N = 196 gives 28, not 29."""
    check_rho(rho)
    if n_tokens < 2:
        raise ConfigError(f"n_tokens={n_tokens}: a sketch needs at least 2 tokens (use a smaller patch_size)")
    return min(max(math.ceil(rho * n_tokens - 1e-6), 1), n_tokens - 1)


def check_hashing(hashing: str) -> None:
    """Raise ConfigError for an unknown hashing scheme."""
    check_value("hashing", hashing, HASHING)


def default_mask_unit(img_size: int, patch_size: int) -> int:
    """SimMIM's 32-px mask unit at 224², scaled to ``img_size``: img_size·32/224 rounded to a multiple of
    ``patch_size`` (at least one patch) that divides ``img_size``; 32 at 224/16, 4 at 32/4, 8 at 64/8.
    """
    target = img_size * 32 / 224
    grid = img_size // patch_size
    sizes = [k * patch_size for k in range(1, grid + 1) if grid % k == 0]
    return min(sizes, key=lambda u: (abs(u - target), u))


@dataclass(frozen=True)
class ModelConfig:
    """What builds a ROPIM model; every field is a plain value so it serializes to JSON."""

    arch: str = "vit_tiny_patch16_224"
    """the width: ViT-T/S/B"""
    backbone: str = "vit"
    """vit: timm ViT, learned absolute position embedding; beit: the paper's (shared relative position bias, layer
    scale 0.1, no absolute position embedding)"""
    img_size: int = 224
    """image side in pixels"""
    patch_size: int = 16
    """patch side in pixels (divides img_size)"""
    in_chans: int = 3
    """image channels (RGB: 3)"""
    depth: int | None = None
    """None keeps the architecture's depth"""
    drop_path_rate: float = 0.1
    """stochastic depth of the encoder in pretraining (the paper's 0.1)"""
    rho: float = 1 / 7
    """the sketch ratio ρ: K' = ceil(ρ·N) buckets for N tokens (the paper's 1/7)"""
    corruption: str = "rop"
    """rop (ROPIM's random orthogonal projection), mask (SimMIM) or none"""
    loss: str = "l1"
    """the reconstruction loss: l1 or l2"""
    hashing: str = "balanced"
    """the sketch's buckets and signs: balanced, uniform, or official (the paper's code's)"""
    literal_scale: bool = False
    """True: S = rho·PᵀP as the paper's code (0.14·PᵀP = 0.98 Π at N=196) in place of Π"""
    init: str = "timm"
    """the paper presets: official (their encoders were trained from it); the CPU presets: timm"""
    mask_ratio: float = 0.6
    """corruption="mask": share of mask units hidden per image (SimMIM's 0.6)"""
    mask_patch_size: int | None = None
    """mask unit in pixels; None: 32 px at 224², scaled (see mask_unit)"""

    def validate(self) -> ModelConfig:
        """Raise ConfigError naming the bad field and its fix."""
        check_fields(self, RULES, "model.")
        if self.in_chans != 3:
            raise ConfigError(f"model.in_chans={self.in_chans!r}: images are decoded as RGB, so in_chans must be 3")
        if self.img_size % self.patch_size:
            raise ConfigError(
                f"img_size={self.img_size}, patch_size={self.patch_size}: the patch size must divide the "
                f"image size (e.g. img_size={self.img_size - self.img_size % self.patch_size})"
            )
        if self.init == "official" and self.backbone != "beit":
            raise ConfigError(f"model.init={self.init!r}: the paper's initialisation of its BEiT-style model needs "
                              "backbone: beit (or init: timm)")
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
