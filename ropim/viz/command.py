"""``ropim viz``: pictures from a checkpoint (the full reconstruction grid) or a registered encoder (the projection
columns, plus predictions when the pretraining run logged its decoder), and Figure 5 — written as PNG files."""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, fields
from pathlib import Path

import torch

from ropim.core.backbone import load_weights
from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM
from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset, validation_images
from ropim.errors import ConfigError
from ropim.tracking.run_meta import IN_PROCESS
from ropim.viz.config import VizConfig
from ropim.viz.figure5 import token_error_figure, token_errors
from ropim.viz.grids import projection_grid, save_reconstruction_grid


def model_config(d: dict) -> ModelConfig:
    """The ModelConfig of a checkpoint's config or a registered encoder's config.json (whose ``arch`` is the timm
    name and ``width`` the ViT width; encoders registered before backbones are ``vit``)."""
    names = {f.name for f in fields(ModelConfig)}
    values = {k: v for k, v in d.items() if k in names}
    if "width" in d:
        values["arch"] = d["width"]
    return ModelConfig(**{"backbone": "vit", **values})


def load_checkpoint_model(folder: str | Path) -> tuple[ROPIM, dict]:
    """(ROPIM with encoder + decoder, the run's config dict) from a Ray Train checkpoint folder
    (``model.safetensors`` + ``config.json``, see ``ropim.train.save_checkpoint``) or from a run folder
    holding ``checkpoint_*`` folders, Ray Train's or the in-process loop's (the newest is used)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "model.safetensors").exists():
        found = sorted([*folder.glob("checkpoint_*/model.safetensors"),
                        *folder.glob(f"{IN_PROCESS}/checkpoint_*/model.safetensors")], key=lambda p: p.stat().st_mtime)
        if not found:
            raise ConfigError(f"checkpoint={str(folder)!r}: no model.safetensors + config.json there or in its "
                              "checkpoint_* folders; pass a Ray Train checkpoint folder "
                              "(ray_results/<run>/checkpoint_…)")
        folder = found[-1].parent
    if not (folder / "config.json").exists():
        raise ConfigError(f"checkpoint={str(folder)!r}: config.json is missing beside model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    if "img_size" not in config.get("model", config):
        raise ConfigError(f"checkpoint={str(folder)!r}: not a pretraining checkpoint (its config holds no model's "
                          "image size); the reconstruction grid needs a pretraining run's checkpoint, or give "
                          "--encoder for the projection columns")
    model = ROPIM(model_config(config.get("model", config)))
    load_weights(model, load_file(str(folder / "model.safetensors")), f"checkpoint {folder}")
    return model.eval(), config


DECODER_ARTIFACT = "decoder/decoder.safetensors"  # optional: decoder.* (+ mask_token) logged on the pretrain run


def load_registered_model(model_uri: str, uri: str | None = None) -> tuple[ModelConfig, ROPIM | None, dict]:
    """(model config, full ROPIM or None, encoder config) of a registered encoder.

    A registered encoder holds only the encoder; the full model (for the prediction columns) is rebuilt
    when the pretraining run also logged ``decoder/decoder.safetensors`` (the ``decoder.*`` and
    ``mask_token`` entries of the ROPIM state dict); otherwise the model is None.
    """
    from ropim.tracking import store
    from ropim.tracking.encoders import resolve_encoder

    ref, state = resolve_encoder(model_uri, uri)  # an alias resolved once: the decoder is of the version loaded
    config, cfg = ref.config, model_config(ref.config)
    run_id = None
    if ref.version:
        run_id = store.client(uri).get_model_version(ref.name, ref.version).tags.get("run_id")
    from safetensors.torch import load_file

    with store.run_artifact(run_id, DECODER_ARTIFACT, uri) if run_id else contextlib.nullcontext() as local:
        if local is None:  # no decoder logged on that run: projection columns only
            return cfg, None, config
        decoder = load_file(str(local))
    model = ROPIM(cfg)
    load_weights(model.encoder, state, f"encoder {model_uri}")
    load_weights(model, decoder, f"encoder {model_uri}: {DECODER_ARTIFACT}", optional=("encoder.",))
    return cfg, model.eval(), config


def decoder_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What to log as ``decoder/decoder.safetensors`` beside a registered encoder: every non-encoder entry."""
    model = getattr(model, "module", model)
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if not k.startswith("encoder.")}


# ---------------------------------------------------------------- `ropim viz`


def run_viz(cfg: VizConfig) -> dict[str, object]:
    """Write the PNGs (and token_errors.json) into ``cfg.out``; return their paths and the Figure-5 numbers.

    ``--checkpoint``: reconstruction.png (5 columns). ``--encoder``: reconstruction.png if the run logged a
    decoder, else projection.png (3 columns: the corruption needs no weights). Always token_errors.png.
    """
    cfg = cfg.resolved().validate()
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

