"""The two encoder backbones, built by timm: ``vit`` (timm VisionTransformer, learned absolute position embedding,
no layer scale) and ``beit`` (the paper's: timm Beit with no absolute position embedding, one relative position
bias shared by all blocks, layer scale 0.1, q/v biases, LayerNorm eps 1e-6).

    spec = encoder_spec("beit", "vit_tiny_patch16_224", img_size=224, patch_size=16)   # (timm name, kwargs)
    encoder = create_encoder(*spec)            # == timm.create_model(spec[0], pretrained=False, **spec[1])
    x = encoder.patch_embed(imgs)              # (B, N, D); the caller may corrupt it (Π, mask token)
    z = encode_patch_embeddings(encoder, x)    # (B, N, D): final-normed patch tokens, cls dropped

The (name, kwargs) pair is plain JSON: stored beside a registered encoder it rebuilds the encoder with timm alone.
``build_classifier`` turns an encoder into a fine-tunable timm classifier the BEiT/SimMIM way.

Pure torch + timm: no Ray, no MLflow.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import timm
import torch
from timm.layers import resample_abs_pos_embed, trunc_normal_
from timm.models import VisionTransformer
from timm.models.beit import Beit
from torch import nn
from torch.utils.checkpoint import checkpoint

from ropim.checks import check_value
from ropim.core.attention import beit_block_unfused
from ropim.core.config import ARCHS, RULES, WIDTHS
from ropim.core.relpos import resize_rel_pos_bias_table
from ropim.errors import ConfigError

BEIT_NAME = "beit_base_patch16_224"  # timm's registered Beit; every width-defining argument is passed explicitly
BEIT_DEPTH = 12
TABLE = "relative_position_bias_table"
SHARED_TABLE = f"rel_pos_bias.{TABLE}"

Encoder = VisionTransformer | Beit


def encoder_spec(
    backbone: str,
    arch: str,
    *,
    img_size: int,
    patch_size: int,
    in_chans: int = 3,
    depth: int | None = None,
    drop_path_rate: float = 0.0,
) -> tuple[str, dict]:
    """(timm model name, kwargs) such that ``timm.create_model(name, pretrained=False, **kwargs)`` builds the
    encoder: no classifier head (``num_classes=0``), average pooling over the final-normed patch tokens, so its
    state dict loads unchanged into ``build_classifier``'s model. ``depth=None`` keeps 12 blocks."""
    check_value("backbone", backbone, RULES["backbone"])  # ModelConfig's rules: one wording, one set of choices
    check_value("arch", arch, RULES["arch"])
    if patch_size <= 0 or img_size <= 0 or img_size % patch_size:
        raise ConfigError(f"img_size={img_size}, patch_size={patch_size}: the patch size must divide the image size")
    if depth is not None and depth < 1:
        raise ConfigError(f"depth={depth}: an encoder needs at least one block (or null for {BEIT_DEPTH})")
    kwargs: dict = dict(img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=0, global_pool="avg")
    if backbone == "vit":  # the same kwargs ropim has always stored for ViT encoders
        kwargs |= dict(fc_norm=False, drop_path_rate=drop_path_rate)
        if depth is not None:
            kwargs["depth"] = depth
        return arch, kwargs
    embed_dim, num_heads = WIDTHS[arch]
    kwargs |= dict(
        embed_dim=embed_dim, num_heads=num_heads, depth=depth or BEIT_DEPTH, mlp_ratio=4.0, qkv_bias=True,
        use_abs_pos_emb=False, use_rel_pos_bias=False, use_shared_rel_pos_bias=True, init_values=0.1,
        use_fc_norm=False, drop_path_rate=drop_path_rate,
    )
    return BEIT_NAME, kwargs


def backbone_of(name: str) -> str:
    """``vit`` or ``beit`` for a timm model name produced by ``encoder_spec``."""
    if name == BEIT_NAME:
        return "beit"
    if name in WIDTHS:
        return "vit"
    raise ConfigError(f"timm model {name!r}: not a ropim encoder; expected {BEIT_NAME} or one of {', '.join(ARCHS)}")


def create_encoder(name: str, kwargs: dict, **overrides) -> Encoder:
    """A randomly initialised encoder from an ``encoder_spec`` pair (``overrides`` replace kwargs); never downloads."""
    backbone_of(name)
    return timm.create_model(name, pretrained=False, **{**kwargs, **overrides})


def official_init_(encoder: Beit, std: float = 0.02) -> Beit:
    """Re-initialise a ``beit`` encoder in place as the paper's code does (csiro-robotics/ROPIM ``models/ropim.py``
    over ``models/vision_transformer.py``, which is BEiT's ``modeling_pretrain.py`` scheme): the weights of every
    Linear and of the patch-embedding convolution, and the cls token, from N(0, std²) cut at ±std (their
    ``trunc_normal_`` passes a=-std, b=std: effective std 0.539·std ≈ 0.0108, |w| ≤ 0.02), those layers' biases 0,
    then block l's attn.proj and mlp.fc2 weights divided by √(2l), l = 1…depth. What timm builds stays: LayerNorms
    (1, 0), q/v biases (0), layer scales (``init_values``) and the relative position bias table (0), as in theirs.
    Drawn with timm's ``trunc_normal_`` (inverse CDF), the function their code calls. timm's own init cuts at ±2
    (absolute), so its weights have std 0.02, and leaves the patch embedding at torch's default; the ``vit``
    backbone and the CPU presets keep timm's."""
    with torch.no_grad():
        for m in encoder.modules():
            if isinstance(m, nn.Linear | nn.Conv2d):
                trunc_normal_(m.weight, std=std, a=-std, b=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        trunc_normal_(encoder.cls_token, std=std, a=-std, b=std)
        for layer, blk in enumerate(encoder.blocks, start=1):
            blk.attn.proj.weight.div_(math.sqrt(2.0 * layer))
            blk.mlp.fc2.weight.div_(math.sqrt(2.0 * layer))
    return encoder


def encode_patch_embeddings(encoder: Encoder, x: torch.Tensor) -> torch.Tensor:
    """Run ``encoder`` from its patch embeddings x (B, N, D) — ``encoder.patch_embed(imgs)``, possibly corrupted by
    the caller — to the final-normed patch tokens (B, N, D), prefix (cls) tokens dropped. The same computation as
    ``encoder.forward_features(imgs)[:, num_prefix_tokens:]``, written with public modules only."""
    if x.ndim != 3:
        raise ValueError(f"patch embeddings must be (B, N, D), got shape {tuple(x.shape)} (dynamic_img_size is "
                         "not supported)")
    if isinstance(encoder, Beit):
        return _encode_beit(encoder, x)
    if isinstance(encoder, VisionTransformer):
        return _encode_vit(encoder, x)
    raise TypeError(f"encoder: expected a timm VisionTransformer or Beit, got {type(encoder).__name__}")


def _run_blocks(encoder: Encoder, x: torch.Tensor, *args: torch.Tensor | None,
                block: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """x through every block as ``block(blk, x, *args)`` (None: ``blk(x, *args)``), checkpointed when the encoder
    says so."""
    for blk in encoder.blocks:
        fn = blk if block is None else functools.partial(block, blk)
        if encoder.grad_checkpointing and torch.is_grad_enabled():
            x = checkpoint(fn, x, *args, use_reentrant=False)
        else:
            x = fn(x, *args)
    return x


def _encode_vit(enc: VisionTransformer, x: torch.Tensor) -> torch.Tensor:
    b = x.shape[0]
    prefix = [t.expand(b, -1, -1) for t in (enc.cls_token, enc.reg_token) if t is not None]  # (B, 1, D), (B, R, D)
    if enc.pos_embed is not None and enc.no_embed_class:  # pos_embed (1, N, D) covers the patches only
        x = x + enc.pos_embed  # (B, N, D)
        x = torch.cat([*prefix, x], dim=1)  # (B, P + N, D), P = num_prefix_tokens
    else:
        x = torch.cat([*prefix, x], dim=1)  # (B, P + N, D)
        if enc.pos_embed is not None:
            x = x + enc.pos_embed  # pos_embed (1, P + N, D)
    x = enc.pos_drop(x)
    x = enc.patch_drop(x)
    x = enc.norm_pre(x)
    x = _run_blocks(enc, x)  # (B, P + N, D)
    x = enc.norm(x)
    return x[:, enc.num_prefix_tokens:]  # (B, N, D)


def _encode_beit(enc: Beit, x: torch.Tensor) -> torch.Tensor:
    x = torch.cat([enc.cls_token.expand(x.shape[0], -1, -1), x], dim=1)  # (B, 1 + N, D)
    if enc.pos_embed is not None:  # None for ropim's beit (relative position bias only)
        x = x + enc.pos_embed  # pos_embed (1, 1 + N, D)
    x = enc.pos_drop(x)
    bias = enc.rel_pos_bias() if enc.rel_pos_bias is not None else None  # (heads, 1 + N, 1 + N), shared by blocks
    own_tables = any(blk.attn.relative_position_bias_table is not None for blk in enc.blocks)
    block = beit_block_unfused if x.device.type == "cpu" and bias is not None and not own_tables else None
    x = _run_blocks(enc, x, bias, block=block)  # (B, 1 + N, D)
    x = enc.norm(x)
    return x[:, enc.num_prefix_tokens:]  # (B, N, D)


def no_weight_decay(model: nn.Module) -> set[str]:
    """Names of ``model``'s parameters kept out of weight decay besides norms and biases (timm's optimizer factory
    skips 1-d parameters itself): cls/register tokens, the absolute position embedding and every relative position
    bias table. Only names of parameters the model has (timm's Beit lists ``pos_embed`` even when it is None)."""
    names = {n for n, _ in model.named_parameters()}
    listed = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    tokens = {"cls_token", "reg_token", "dist_token", "pos_embed"}
    tables = {n for n in names if n.endswith(TABLE)}
    return (listed | tokens | tables) & names


@dataclass(frozen=True)
class Classifier:
    """A timm classifier built from an encoder; ``timm.create_model(name, pretrained=False, **kwargs)`` rebuilds its
    architecture, ``actions`` says what was done to the encoder's weights on the way."""

    model: Encoder
    name: str
    kwargs: dict
    actions: tuple[str, ...]

    def summary(self) -> str:
        """One line for the log."""
        return "; ".join(self.actions)


def classifier_spec(name: str, kwargs: dict, num_classes: int, img_size: int | None = None,
                    drop_path: float = 0.0) -> tuple[str, dict]:
    """(timm name, kwargs) of the classifier ``build_classifier`` makes from an encoder pair: ``num_classes`` outputs
    (0: pooled features) at ``img_size`` (None: the encoder's); ``beit`` gets one relative position bias per block
    and, with a head, the official fine-tune's mean pooling (``USE_MEAN_POOLING``: a fresh LayerNorm after pooling
    in place of the encoder's final norm)."""
    out = {**kwargs, "img_size": img_size or kwargs["img_size"], "num_classes": num_classes,
           "drop_path_rate": drop_path}
    if backbone_of(name) == "beit":
        out |= dict(use_rel_pos_bias=True, use_shared_rel_pos_bias=False, use_fc_norm=num_classes > 0)
    return name, out


def build_classifier(name: str, kwargs: dict, state: dict[str, torch.Tensor] | None, num_classes: int,
                     img_size: int | None = None, drop_path: float = 0.0, source: str = "encoder") -> Classifier:
    """A classifier from the encoder ``(name, kwargs)`` with ``state`` (its state dict; None: random init; ``source``
    names it in an error), ``num_classes`` outputs (0: pooled features) at ``img_size`` (None: the pretraining
    size), the BEiT/SimMIM way:

    - ``vit``: weights loaded as they are; the absolute position embedding resampled (bicubic) on a new grid.
    - ``beit``: the shared relative position bias table copied into every block's own table, resampled when the
      grid changes as BEiT does (``ropim.core.relpos``: geometric offsets, bicubic spline, the 3 cls entries kept);
      position index buffers are the new model's own.
    """
    name, ckw = classifier_spec(name, kwargs, num_classes, img_size, drop_path)
    model = timm.create_model(name, pretrained=False, **ckw)
    src, dst = kwargs["img_size"], ckw["img_size"]
    if state is None:
        return Classifier(model, name, ckw, (f"random init ({name} at {dst}x{dst}, weights not loaded)",))
    old = _grid(kwargs)
    new = tuple(model.patch_embed.grid_size)
    state = {k: v for k, v in state.items() if not k.endswith("relative_position_index")}
    actions: list[str] = []
    if backbone_of(name) == "vit":
        pos = state.get("pos_embed")
        if pos is not None and pos.shape != model.pos_embed.shape:
            prefix = 0 if model.no_embed_class else model.num_prefix_tokens
            state["pos_embed"] = resample_abs_pos_embed(pos, new_size=list(new), old_size=list(old),
                                                        num_prefix_tokens=prefix)
            actions.append(f"position embedding resampled from a {old[0]}x{old[1]} to a {new[0]}x{new[1]} grid "
                           "(timm resample_abs_pos_embed, bicubic)")
    else:
        actions += _per_block_tables(model, state, old, new)
    if ckw.get("use_fc_norm"):  # the encoder's final norm gives way to fc_norm, which starts fresh
        state = {k: v for k, v in state.items() if not k.startswith("norm.")}
        actions.append("mean pooling into a fresh LayerNorm (fc_norm) in place of the encoder's final norm")
    load_weights(model, state, source, optional=("head.", "fc_norm."))
    actions.insert(0, f"encoder weights loaded into {name} at {dst}x{dst} (pretrained at {src}x{src})")
    return Classifier(model, name, ckw, tuple(actions))


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], what: str, optional: tuple[str, ...] = ()) -> None:
    """Load ``state`` into ``model``, or raise one ConfigError naming ``what`` when the tensors do not fit it (another
    shape, a name it lacks, one of its own not given); names starting with an ``optional`` prefix may be absent."""
    own = model.state_dict()
    wrong = [(k, list(v.shape), list(own[k].shape)) for k, v in state.items() if k in own and own[k].shape != v.shape]
    unexpected = sorted(set(state) - set(own))
    missing = sorted(k for k in set(own) - set(state) if not k.startswith(optional))
    problems = []
    if wrong:
        problems.append(f"{len(wrong)} of another shape, e.g. {wrong[0][0]} {wrong[0][1]} vs {wrong[0][2]}")
    if missing:
        problems.append(f"{len(missing)} missing, e.g. {missing[0]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected, e.g. {unexpected[0]}")
    if problems:
        raise ConfigError(f"{what}: the weights do not fit the {type(model).__name__} its config describes "
                          f"({'; '.join(problems)}); config.json and the weights come from different models, or the "
                          "model was built with other arguments")
    model.load_state_dict(state, strict=False)


def _grid(kwargs: dict) -> tuple[int, int]:
    size, patch = kwargs["img_size"], kwargs["patch_size"]
    return size // patch, size // patch


def _per_block_tables(model: Beit, state: dict[str, torch.Tensor], old: tuple[int, int],
                      new: tuple[int, int]) -> list[str]:
    """Fill ``state`` (in place) with one relative position bias table per block of ``model``; what was done."""
    actions = []
    tables = [k for k in state if k.endswith(TABLE)]
    if old != new and tables:
        n_old, n_new = (2 * old[0] - 1) * (2 * old[1] - 1), (2 * new[0] - 1) * (2 * new[1] - 1)
        for k in tables:  # (n_old + 3, heads) -> (n_new + 3, heads)
            state[k] = resize_rel_pos_bias_table(state[k], old, new)
        actions.append(f"relative position bias resampled from a {old[0]}x{old[1]} to a {new[0]}x{new[1]} grid "
                       f"({n_old}+3 -> {n_new}+3 entries: BEiT's geometric offsets and bicubic spline, offsets 0 "
                       "and ±1 and the 3 cls entries kept)")
    shared = state.pop(SHARED_TABLE, None)
    if shared is not None:
        for i in range(len(model.blocks)):
            state[f"blocks.{i}.attn.{TABLE}"] = shared.clone()
        actions.append(f"shared relative position bias copied into each of the {len(model.blocks)} blocks")
    return actions
