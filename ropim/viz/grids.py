"""Reconstruction pictures: what ROP (and masking) does to an image, and what the model predicts (paper Figs. 3,
6, 7).

* ``reconstruction_grid(model, imgs, generator)`` — one row per image, columns
  original | ΠX (sketched) | (I−Π)X (complement) | (I−Π)X̃ (predicted complement) | ΠX + (I−Π)X̃.
  Π acts on the patch pixels: ΠX = unpatchify(Π patchify(X)), X the normalized pixels; every column is
  un-normalized with the ImageNet mean/std and clipped to [0, 1]. For ``corruption="mask"`` the same
  columns read original | visible | masked | predicted masked | visible + predicted masked (masking is
  the orthogonal projection Π = diag(1 − m)); for ``none``: original | prediction.
* ``projection_grid(cfg, imgs, generator)`` — the first three columns only; needs no weights.

PIL and torch only; no Ray, no MLflow.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from ropim.core.config import ModelConfig
from ropim.core.masking import PatchMask, draw_mask
from ropim.core.model import Corruption, patchify, unpatchify
from ropim.core.sketch import draw_sketch
from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD

PAD = 2  # pixels between panels and around the grid
HEADER = 16  # pixels of the title strip above the panels
TITLES = {
    "rop": ("original", "PX sketch", "(I-P)X compl.", "(I-P)X~ pred", "PX+(I-P)X~"),
    "mask": ("original", "visible", "masked", "pred masked", "visible+pred"),
    "none": ("original", "prediction"),
}


# ---------------------------------------------------------------- grids


def default_scale(img_size: int) -> int:
    """Integer upscaling so a panel is about 128 px wide (4 at 32², 1 at 224²)."""
    return max(1, 128 // img_size)


def grid_size(n_images: int, n_columns: int, img_size: int, scale: int | None = None) -> tuple[int, int]:
    """(width, height) in pixels of a grid of ``n_images`` rows and ``n_columns`` panels."""
    side = img_size * (scale or default_scale(img_size))
    return n_columns * side + (n_columns + 1) * PAD, HEADER + n_images * side + (n_images + 1) * PAD


def unnormalize(x: torch.Tensor) -> torch.Tensor:
    """Normalized images (B, C, H, W) -> pixels in [0, 1] (ImageNet mean/std; their average for C ≠ 3)."""
    c = x.shape[1]
    mean = torch.tensor(IMAGENET_MEAN if c == 3 else [sum(IMAGENET_MEAN) / 3] * c, dtype=x.dtype, device=x.device)
    std = torch.tensor(IMAGENET_STD if c == 3 else [sum(IMAGENET_STD) / 3] * c, dtype=x.dtype, device=x.device)
    return (x * std.view(1, c, 1, 1) + mean.view(1, c, 1, 1)).clamp(0, 1)


def render_grid(columns: list[torch.Tensor], titles: tuple[str, ...] | list[str], scale: int | None = None
                ) -> Image.Image:
    """An RGB image: one row per image, one panel per column (normalized (B, C, H, W) tensors), titled."""
    b, c, h, w = columns[0].shape
    scale = scale or default_scale(h)
    width, height = grid_size(b, len(columns), h, scale)
    canvas = np.full((height, width, 3), 255, dtype=np.uint8)
    side = h * scale
    for j, col in enumerate(columns):
        px = unnormalize(col.detach().float().cpu())
        px = px.repeat_interleave(scale, 2).repeat_interleave(scale, 3)  # nearest: patches stay crisp
        px = (px * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        if c != 3:
            px = np.repeat(px[..., :1], 3, axis=-1)
        x0 = PAD + j * (side + PAD)
        for i in range(b):
            y0 = HEADER + PAD + i * (side + PAD)
            canvas[y0 : y0 + side, x0 : x0 + side] = px[i]
    img = Image.fromarray(canvas)
    draw, font = ImageDraw.Draw(img), ImageFont.load_default(11)
    for j, title in enumerate(titles):
        x0 = PAD + j * (side + PAD)
        tw = draw.textlength(title, font=font)
        draw.text((x0 + max(0.0, (side - tw) / 2), 2), title, fill=(0, 0, 0), font=font)
    return img


def draw_corruption_for(cfg: ModelConfig, batch_size: int, generator: torch.Generator | None = None,
                        device: torch.device | str | None = None) -> Corruption:
    """The corruption ``cfg`` describes, without a model (``rop`` for ``none``: a picture needs one)."""
    if cfg.corruption == "mask":
        return draw_mask(batch_size, cfg.img_size, cfg.patch_size, cfg.mask_unit, cfg.n_masked_units,
                         generator=generator, device=device)
    return draw_sketch(batch_size, cfg.n_tokens, cfg.rho, generator=generator, device=device, hashing=cfg.hashing,
                       literal_scale=cfg.literal_scale)


def corruption_columns(imgs: torch.Tensor, patch_size: int, corruption: Corruption,
                       pred: torch.Tensor | None = None) -> list[torch.Tensor]:
    """[X, ΠX, (I−Π)X] and, given X̃ (B, N, p²C), [(I−Π)X̃, ΠX + (I−Π)X̃], as normalized images."""
    c = imgs.shape[1]
    x = patchify(imgs, patch_size)
    if corruption is None:
        return [imgs] + ([unpatchify(pred, patch_size, c)] if pred is not None else [])
    kept = corruption.project(x)
    cols = [imgs, unpatchify(kept, patch_size, c), unpatchify(corruption.complement(x), patch_size, c)]
    if pred is not None:
        pred_c = corruption.complement(pred.to(x.dtype))
        cols += [unpatchify(pred_c, patch_size, c), unpatchify(kept + pred_c, patch_size, c)]
    return cols


def _to_device(corruption: Corruption, device: torch.device) -> Corruption:
    """The corruption's tensors on ``device`` (a CPU generator may drive a GPU model's picture)."""
    if corruption is None:
        return None
    moved = {f.name: getattr(corruption, f.name) for f in fields(corruption)}
    return type(corruption)(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


def _titles(corruption: Corruption, n: int) -> tuple[str, ...]:
    kind = "mask" if isinstance(corruption, PatchMask) else "none" if corruption is None else "rop"
    return TITLES[kind][:n]


@torch.no_grad()
def reconstruction_grid(model: torch.nn.Module, imgs: torch.Tensor, generator: torch.Generator | None = None,
                        scale: int | None = None) -> Image.Image:
    """The 5-column reconstruction grid (module docstring) of a ROPIM model on normalized images (B, C, H, W).

    ``model`` may be wrapped (DDP): its ``.module`` is used. The corruption is drawn from ``generator``
    (pass a fixed seed to compare the same Π across epochs); the model runs in eval mode and its
    train/eval mode is restored. Returns an RGB ``PIL.Image`` of size ``grid_size(B, 5, H, scale)``.
    """
    model = getattr(model, "module", model)
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        imgs = imgs.to(device)
        corruption = _to_device(model.draw_corruption(imgs.shape[0], generator), device)
        pred = model.reconstruct(imgs, corruption)
    finally:
        model.train(was_training)
    cols = corruption_columns(imgs, model.cfg.patch_size, corruption, pred)
    return render_grid(cols, _titles(corruption, len(cols)), scale)


def save_reconstruction_grid(model: torch.nn.Module, imgs: torch.Tensor, path: str | Path,
                             generator: torch.Generator | None = None, scale: int | None = None) -> Path:
    """``reconstruction_grid`` written as a PNG at ``path`` (parent folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    reconstruction_grid(model, imgs, generator, scale).save(path, format="PNG")
    return path


@torch.no_grad()
def projection_grid(cfg: ModelConfig, imgs: torch.Tensor, generator: torch.Generator | None = None,
                    scale: int | None = None) -> Image.Image:
    """original | ΠX | (I−Π)X for the corruption in ``cfg`` (no weights needed): 3 columns."""
    imgs = imgs.detach().cpu()
    corruption = draw_corruption_for(cfg, imgs.shape[0], generator, generator.device if generator is not None else None)
    corruption = _to_device(corruption, imgs.device)
    cols = corruption_columns(imgs, cfg.patch_size, corruption)
    return render_grid(cols, _titles(corruption, len(cols)), scale)
