"""What a pretraining leaves: the encoder of its final checkpoint registered (``register_encoder``, the job's register
function; a sweep's best trial too), or written to a folder (``export_encoder``), with its JSON config
(``encoder_config``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from ropim.core.model import encoder_spec
from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef
from ropim.train.pretrain.config import PretrainConfig


def encoder_config(cfg: PretrainConfig, embed_dim: int) -> dict:
    """The JSON config stored beside a registered encoder."""
    m = cfg.model
    name, kwargs = encoder_spec(m)
    return {
        "arch": name, "backbone": m.backbone, "width": m.arch, "img_size": m.img_size, "patch_size": m.patch_size,
        "in_chans": m.in_chans, "embed_dim": embed_dim, "depth": m.depth, "rho": m.rho, "corruption": m.corruption,
        "loss": m.loss, "hashing": m.hashing, "literal_scale": m.literal_scale, "init": m.init,
        "mask_ratio": m.mask_ratio, "mask_patch_size": m.mask_patch_size, "epochs": cfg.epochs,
        "dataset": cfg.data.source, "timm_kwargs": kwargs,
    }


def split_checkpoint(folder: Path, cfg: PretrainConfig) -> tuple[dict, dict, dict]:
    """(encoder weights, encoder config, decoder weights) of a pretraining checkpoint folder."""
    state = load_file(str(Path(folder) / "model.safetensors"))
    decoder = {k: v for k, v in state.items() if not k.startswith("encoder.")}
    encoder_state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    return encoder_state, encoder_config(cfg, encoder_state["cls_token"].shape[-1]), decoder


def register_encoder(cfg: PretrainConfig, ref: EncoderRef | None, run_id: str, folder: Path, tracking: str) -> str:
    """The job's register function (``ropim.train.jobs``; a sweep's best trial too): the encoder of a final checkpoint
    ``folder`` registered, the decoder logged beside it; its URI."""
    encoder_state, config, decoder = split_checkpoint(folder, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        save_file(decoder, str(Path(tmp) / "decoder.safetensors"))
        store.log_artifact(run_id, Path(tmp) / "decoder.safetensors", "decoder", tracking)
    return registry.register_encoder(run_id, encoder_state, config, cfg.registered_model, tracking)


def export_encoder(folder: Path, cfg: PretrainConfig, dst: Path) -> Path:
    """Write the encoder of a checkpoint folder into the folder ``dst`` as ``encoder.safetensors`` + ``config.json``
    (what ``--encoder FOLDER`` and ``runs:/<run_id>/<path>`` read); return ``dst``."""
    encoder_state, config, _ = split_checkpoint(folder, cfg)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in encoder_state.items()}, str(dst / "encoder.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    return dst

