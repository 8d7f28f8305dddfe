"""What a graft leaves (``register_graft``, the job's register function): the grafted encoder as a new version of the
encoder model, tagged ``stage: lgp``, its config naming the first stage it started from."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef
from ropim.tracking.uri import ModelRef
from ropim.train.graft.config import GraftConfig
from ropim.train.job import dataset_name


def source_run(ref: EncoderRef, tracking: str) -> str:
    """The MLflow run that trained the encoder ``ref`` (its first stage), or "" for a plain folder."""
    if ref.version is not None:
        return store.client(tracking).get_model_version(ref.name, ref.version).run_id or ""
    return ModelRef.parse(ref.pinned).run_id  # "" unless runs:/


def grafted_config(cfg: GraftConfig, ref: EncoderRef, first_run: str) -> dict:
    """The registered config of a grafted encoder: the first stage's, plus what the graft did and where it began."""
    return {**ref.config, "stage": "lgp", "source_encoder": ref.pinned, "source_run": first_run,
            "graft_epochs": cfg.epochs, "graft_dataset": dataset_name(cfg.data), "lower_blocks": cfg.lower_blocks,
            "lower_lr_ratio": cfg.lower_lr_ratio, "temperature": cfg.temperature, "momentum": cfg.momentum}


def register_graft(cfg: GraftConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> str | None:
    """The job's register function (``ropim.train.jobs``): the encoder of the final graft checkpoint ``folder`` (the
    base encoder only) as a new version of ``registered_model`` with its lineage."""
    state = load_file(str(folder / "model.safetensors"))
    encoder = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    config = grafted_config(cfg, ref, source_run(ref, tracking))
    return registry.register_encoder(run_id, encoder, config, cfg.registered_model, tracking)


