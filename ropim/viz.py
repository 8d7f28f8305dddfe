"""Pictures: what ROP (and masking) does to an image, and what the model predicts (paper Figs. 3, 5, 6, 7).

* ``reconstruction_grid(model, imgs, generator)`` — one row per image, columns
  original | ΠX (sketched) | (I−Π)X (complement) | (I−Π)X̃ (predicted complement) | ΠX + (I−Π)X̃.
  Π acts on the patch pixels: ΠX = unpatchify(Π patchify(X)), X the normalized pixels; every column is
  un-normalized with the ImageNet mean/std and clipped to [0, 1]. For ``corruption="mask"`` the same
  columns read original | visible | masked | predicted masked | visible + predicted masked (masking is
  the orthogonal projection Π = diag(1 − m)); for ``none``: original | prediction.
* ``projection_grid(cfg, imgs, generator)`` — the first three columns only; needs no weights (what
  ``ropim viz --encoder`` shows when the registered encoder has no decoder beside it).
* ``token_errors(imgs, patch_size)`` + ``token_error_figure`` — Figure 5: the ℓ1 error per token between
  corrupted and original tokens for ROP (rho 0.25) and masking (ratio 0.75), histograms side by side,
  and how many tokens each changes by more than 0.1.
* ``run_viz(VizConfig)`` — ``ropim viz``: the PNGs from a Ray Train checkpoint folder or a registered encoder.

Matplotlib (Agg canvas, no global backend switch) and PIL only; no Ray. MLflow only inside ``run_viz``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from ropim.data import IMAGENET_MEAN, IMAGENET_STD, DataConfig, build_dataset, eval_transform
from ropim.errors import ConfigError
from ropim.model import ROPIM, Corruption, ModelConfig, PatchMask, draw_mask, patchify, unpatchify
from ropim.sketch import draw_sketch

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
    return draw_sketch(batch_size, cfg.n_tokens, cfg.rho, generator=generator, device=device, hashing=cfg.hashing)


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


# ---------------------------------------------------------------- figure 5


@dataclass
class TokenErrors:
    """Per-token ℓ1 errors (mean |corrupted − original| over a token's p²C normalized pixels)."""

    rop: np.ndarray  # (images × tokens,)
    mask: np.ndarray  # (images × tokens,)
    n_images: int
    n_tokens: int  # per image
    rho: float
    mask_ratio: float
    threshold: float

    def summary(self) -> dict[str, float | int]:
        """Counts and shares of tokens changed by more than ``threshold``, and mean errors: plain numbers."""
        total = self.n_images * self.n_tokens
        out: dict[str, float | int] = {
            "n_images": self.n_images, "tokens_per_image": self.n_tokens, "tokens": total,
            "rho": self.rho, "mask_ratio": self.mask_ratio, "threshold": self.threshold,
        }
        for name, err in (("rop", self.rop), ("mask", self.mask)):
            changed = int((err > self.threshold).sum())
            out |= {
                f"{name}_changed": changed,
                f"{name}_changed_share": changed / total,
                f"{name}_changed_per_image": changed / self.n_images,
                f"{name}_mean_error": float(err.mean()),
            }
        return out


@torch.no_grad()
def token_errors(imgs: torch.Tensor, patch_size: int, rho: float = 0.25, mask_ratio: float = 0.75,
                 threshold: float = 0.1, generator: torch.Generator | None = None,
                 hashing: str = "balanced") -> TokenErrors:
    """Figure 5 on normalized images (B, C, H, W): ROP corrupts tokens into ΠX (a fresh sketch per image),
    masking into diag(1 − m)X — masked tokens become 0, i.e. the dataset's mean colour — with exactly
    round(mask_ratio·N) patches masked per image. ROP spreads the change over (almost) every token;
    masking leaves the visible ones exact, so ROP changes more tokens by more than ``threshold``.
    """
    b, _, h, _ = imgs.shape
    n = (h // patch_size) ** 2
    device = generator.device if generator is not None else torch.device("cpu")
    x = patchify(imgs.detach().float().to(device), patch_size)
    sketch = draw_sketch(b, n, rho, generator=generator, device=device, hashing=hashing)
    n_masked = min(max(round(mask_ratio * n), 1), n - 1)
    mask = draw_mask(b, h, patch_size, patch_size, n_masked, generator=generator, device=device)
    rop = (sketch.project(x) - x).abs().mean(-1).reshape(-1).cpu().numpy()
    masked = (mask.project(x) - x).abs().mean(-1).reshape(-1).cpu().numpy()
    return TokenErrors(rop, masked, b, n, rho, mask_ratio, threshold)


def token_error_figure(errors: TokenErrors, path: str | Path | None = None, size: tuple[int, int] = (1000, 400)
                       ) -> Image.Image:
    """Histograms of the per-token errors, ROP | masking side by side, as an RGB image of ``size`` pixels
    (written as a PNG at ``path`` if given)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    top = float(max(errors.rop.max(), errors.mask.max(), errors.threshold)) * 1.02
    bins = np.linspace(0.0, top, 41)
    s = errors.summary()
    axes = fig.subplots(1, 2, sharey=True)
    for ax, name, err, label in (
        (axes[0], "rop", errors.rop, f"ROP, rho={errors.rho:g}"),
        (axes[1], "mask", errors.mask, f"masking, ratio={errors.mask_ratio:g}"),
    ):
        ax.hist(err, bins=bins, color="tab:blue" if name == "rop" else "tab:orange")
        ax.axvline(errors.threshold, color="k", linestyle="--", linewidth=1)
        ax.set_title(f"{label}: {s[f'{name}_changed']}/{s['tokens']} tokens changed > {errors.threshold:g}",
                     fontsize=10)
        ax.set_xlabel("per-token l1 error (normalized pixels)")
    axes[0].set_ylabel(f"tokens ({errors.n_images} images x {errors.n_tokens})")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.9, wspace=0.08)
    canvas.draw()
    img = Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        img.save(path, format="PNG")
    return img


# ---------------------------------------------------------------- data and models for `ropim viz`


def validation_images(data: DataConfig, img_size: int, n: int = 6, split: str = "val") -> torch.Tensor:
    """The first ``n`` images of ``split`` (deterministic, eval transform): normalized (n, C, H, W)."""
    ds = build_dataset(data, split, eval_transform(img_size), img_size)
    if n < 1 or n > len(ds):
        raise ConfigError(f"n_images={n}: must be between 1 and {len(ds)} (the {split} split of {data.source})")
    return torch.stack([ds[i][0] for i in range(n)])


def _model_config(d: dict) -> ModelConfig:
    names = {f.name for f in fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in d.items() if k in names})


def load_checkpoint_model(folder: str | Path) -> tuple[ROPIM, dict]:
    """(ROPIM with encoder + decoder, the run's config dict) from a Ray Train checkpoint folder
    (``model.safetensors`` + ``config.json``, see ``ropim.train.save_checkpoint``) or from a run folder
    holding ``checkpoint_*`` folders (the last one is used)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        found = sorted(folder.glob("checkpoint_*/model.safetensors"))
        if not found:
            raise ConfigError(f"checkpoint={str(folder)!r}: no model.safetensors + config.json there or in its "
                              "checkpoint_* folders; pass a Ray Train checkpoint folder "
                              "(ray_results/<run>/checkpoint_…)")
        folder = found[-1].parent
    if not (folder / "config.json").exists():
        raise ConfigError(f"checkpoint={str(folder)!r}: config.json is missing beside model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    model = ROPIM(_model_config(config.get("model", config)))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    return model.eval(), config


DECODER_ARTIFACT = "decoder/decoder.safetensors"  # optional: decoder.* (+ mask_token) logged on the pretrain run


def load_registered_model(model_uri: str, uri: str | None = None) -> tuple[ModelConfig, ROPIM | None, dict]:
    """(model config, full ROPIM or None, encoder config) of a registered encoder.

    A registered encoder holds only the encoder; the full model (for the prediction columns) is rebuilt
    when the pretraining run also logged ``decoder/decoder.safetensors`` (the ``decoder.*`` and
    ``mask_token`` entries of the ROPIM state dict); otherwise the model is None.
    """
    from ropim import registry

    state, config = registry.load_encoder_files(model_uri, uri)
    cfg = _model_config(config)
    version = registry.resolve_version(model_uri, uri)
    run_id = None
    if version:
        run_id = registry.client(uri).get_model_version(*version).tags.get("run_id")
    if run_id is None:
        return cfg, None, config
    import mlflow
    from safetensors.torch import load_file

    try:
        local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=DECODER_ARTIFACT)
    except Exception:  # no decoder logged on that run: projection columns only
        return cfg, None, config
    model = ROPIM(cfg)
    model.encoder.load_state_dict(state, strict=True)
    missing, unexpected = model.load_state_dict(load_file(local), strict=False)
    if unexpected or any(not k.startswith("encoder.") for k in missing):
        raise ConfigError(f"encoder {model_uri}: {DECODER_ARTIFACT} does not match ({missing=}, {unexpected=})")
    return cfg, model.eval(), config


def decoder_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What to log as ``decoder/decoder.safetensors`` beside a registered encoder: every non-encoder entry."""
    model = getattr(model, "module", model)
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.startswith("encoder.")}


# ---------------------------------------------------------------- `ropim viz`


@dataclass(frozen=True)
class VizConfig:
    """``ropim viz``: pictures from a checkpoint (full grid) or a registered encoder, and Figure 5."""

    encoder: str | None = None  # models:/… of a registered encoder: projection columns (+ predictions with a decoder)
    checkpoint: str | None = None  # Ray Train checkpoint folder (model.safetensors + config.json): the full grid
    out: str = "viz"  # output folder for the PNGs and token_errors.json
    n_images: int = 6  # rows of the reconstruction grid (first images of the split)
    split: str = "val"
    scale: int | None = None  # panel upscaling; None: about 128 px per panel
    seed: int = 0  # seeds the corruption drawn for the pictures
    fig5_images: int = 64  # images in the Figure-5 analysis
    fig5_rho: float = 0.25
    fig5_mask_ratio: float = 0.75
    fig5_threshold: float = 0.1

    def validate(self) -> VizConfig:
        if self.encoder and self.checkpoint:
            raise ConfigError("--encoder and --checkpoint: give one of them (or neither for Figure 5 only)")
        for name in ("n_images", "fig5_images"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if self.scale is not None and self.scale < 1:
            raise ConfigError(f"scale={self.scale}: must be ≥ 1 (or null for the default)")
        if not 0 < self.fig5_mask_ratio < 1:
            raise ConfigError(f"fig5_mask_ratio={self.fig5_mask_ratio}: must be in (0, 1)")
        if self.checkpoint and not Path(self.checkpoint).is_dir():
            raise ConfigError(f"checkpoint={self.checkpoint!r}: no such folder")
        return self


def run_viz(cfg: VizConfig) -> dict[str, object]:
    """Write the PNGs (and token_errors.json) into ``cfg.out``; return their paths and the Figure-5 numbers.

    ``--checkpoint``: reconstruction.png (5 columns). ``--encoder``: reconstruction.png if the run logged a
    decoder, else projection.png (3 columns: the corruption needs no weights). Always token_errors.png.
    """
    cfg.validate()
    out = Path(cfg.out)
    model, data, written = None, DataConfig(), {}
    if cfg.checkpoint:
        model, run_cfg = load_checkpoint_model(cfg.checkpoint)
        mcfg = model.cfg
        data = DataConfig(**run_cfg["data"]) if isinstance(run_cfg.get("data"), dict) else data
    elif cfg.encoder:
        mcfg, model, enc_cfg = load_registered_model(cfg.encoder)
        data = DataConfig(source=enc_cfg.get("dataset", data.source))
    else:
        mcfg = ModelConfig(img_size=32, patch_size=4)  # the CPU-size default of ropim.train
    gen = torch.Generator().manual_seed(cfg.seed)
    if model is not None or cfg.encoder:
        imgs = validation_images(data, mcfg.img_size, cfg.n_images, cfg.split)
        if model is not None:
            written["reconstruction"] = save_reconstruction_grid(model, imgs, out / "reconstruction.png", gen,
                                                                 cfg.scale)
        else:
            path = out / "projection.png"
            out.mkdir(parents=True, exist_ok=True)
            projection_grid(mcfg, imgs, gen, cfg.scale).save(path, format="PNG")
            written["projection"] = path
    fig5_imgs = validation_images(data, mcfg.img_size, min(cfg.fig5_images, _split_len(data, cfg.split)),
                                  cfg.split)
    errors = token_errors(fig5_imgs, mcfg.patch_size, cfg.fig5_rho, cfg.fig5_mask_ratio, cfg.fig5_threshold,
                          torch.Generator().manual_seed(cfg.seed + 1))
    written["token_errors"] = out / "token_errors.png"
    token_error_figure(errors, written["token_errors"])
    summary = errors.summary()
    (out / "token_errors.json").write_text(json.dumps(summary, indent=2))
    return {"paths": {k: str(v) for k, v in written.items()}, "token_errors": summary, "config": asdict(cfg)}


def _split_len(data: DataConfig, split: str) -> int:
    return len(build_dataset(data, split))


def describe(result: dict) -> str:
    """The lines ``ropim viz`` prints."""
    lines = [f"wrote {p}" for p in result["paths"].values()]
    s = result["token_errors"]
    lines.append(
        f"Figure 5 ({s['n_images']} images x {s['tokens_per_image']} tokens): tokens changed > {s['threshold']:g}: "
        f"ROP rho={s['rho']:g} {s['rop_changed']} ({100 * s['rop_changed_share']:.1f}%), "
        f"masking {s['mask_ratio']:g} {s['mask_changed']} ({100 * s['mask_changed_share']:.1f}%)"
    )
    return "\n".join(lines)

