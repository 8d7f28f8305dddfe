"""What a fine-tune leaves: per-class accuracy and the confusion matrix of its final evaluation in MLflow, the encoder
version tagged with ``downstream.<dataset>.top1`` (``log_classifier_results``, the job's results function), the
classifier registered (``register_classifier``, the job's register function: ``ropim-classifier``, loaded without
pickle)."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef
from ropim.train.downstream import classifier_config, final_eval, log_results, tag_version
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.job import dataset_name


def log_classifier_results(cfg: FinetuneConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> None:
    """The job's results function (``ropim.train.jobs``): per-class accuracy and the confusion matrix of the final
    evaluation, and the encoder version tagged with the score (unless the encoder was not loaded)."""
    name, ev = dataset_name(cfg.data), final_eval(folder)
    log_results(run_id, ev["confusion"], ev["classes"], tracking, step=ev["epoch"],
                title=f"{cfg.kind} of {ref.label} on {name}: top-1 {ev['top1']:.2f}%")
    store.log_metrics(run_id, {"final_top1": ev["top1"], "final_top5": ev["top5"]}, ev["epoch"], tracking)
    if not cfg.random_init:
        tag_version(ref, {f"downstream.{name}.top1": ev["top1"]}, tracking)


def register_classifier(cfg: FinetuneConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> str | None:
    """The job's register function (``ropim.train.jobs``): the classifier as a new version of ``registered_model``,
    or None when the encoder was not loaded (random init)."""
    if cfg.random_init:
        return None
    ev = final_eval(folder)
    config = classifier_config(ref, ev["classes"], ev["img_size"], dataset_name(cfg.data), ev)
    return registry.register_classifier(run_id, load_file(str(folder / "model.safetensors")), config,
                                        cfg.registered_model, tracking)
