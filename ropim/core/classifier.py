"""A classifier (or a pooled-feature model) rebuilt from a registered encoder's config and weights, at any image
size (the position embedding resampled). Pure torch + timm."""

from __future__ import annotations

import logging

import timm
import torch
from timm.layers import resample_abs_pos_embed

from ropim.errors import ConfigError

log = logging.getLogger("ropim.downstream")


def build_model(config: dict, state: dict[str, torch.Tensor] | None, num_classes: int, img_size: int | None = None,
                drop_path: float = 0.0, uri: str = "encoder", quiet: bool = False) -> timm.models.VisionTransformer:
    """A timm ViT with the encoder's architecture, ``num_classes`` outputs (0: pooled features) at ``img_size``,
    loaded from ``state`` (None: random init). A different image size resamples the position embedding."""
    src = config["img_size"]
    img_size = img_size or src
    kwargs = {**config["timm_kwargs"], "img_size": img_size, "num_classes": num_classes, "drop_path_rate": drop_path}
    model = timm.create_model(config["arch"], pretrained=False, **kwargs)
    if state is None:
        return model
    state = dict(state)
    pos = state.get("pos_embed")
    if pos is not None and pos.shape != model.pos_embed.shape:
        p = config["patch_size"]
        old, new = (src // p, src // p), tuple(model.patch_embed.grid_size)
        prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        state["pos_embed"] = resample_abs_pos_embed(pos, new_size=list(new), old_size=list(old),
                                                    num_prefix_tokens=prefix)
        if not quiet:
            log.info(f"[downstream] encoder {uri} was pretrained at {src}x{src}, used at {img_size}x{img_size}: "
                     f"position embedding resampled from a {old[0]}x{old[1]} to a {new[0]}x{new[1]} grid "
                     "(timm resample_abs_pos_embed, bicubic)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("head.") for k in missing):
        raise ConfigError(f"encoder {uri}: weights do not match {config['arch']} ({missing=}, {unexpected=})")
    return model
