"""What a fine-tune leaves (``register_classifier``, the job's register function): per-class accuracy and the
confusion matrix of its final evaluation in MLflow, the classifier registered (``ropim-classifier``, loaded without
pickle), the encoder version tagged with ``downstream.<dataset>.top1``."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from ropim.tracking import registry, store
from ropim.tracking.encoders import EncoderRef
from ropim.train.downstream import classifier_config, log_results, tag_version
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.job import dataset_name


def register_classifier(cfg: FinetuneConfig, ref: EncoderRef, run_id: str, folder: Path, tracking: str) -> str | None:
    """The job's register function (``ropim.train.jobs``): log per-class accuracy and the confusion matrix of the final
    evaluation, register the classifier (unless ``registered_model`` is "" or the encoder was not loaded), tag the
    encoder version with the score."""
    name = dataset_name(cfg.data)
    ev = json.loads((folder / "metrics.json").read_text())["eval"]
    log_results(run_id, ev["confusion"], ev["classes"], tracking, step=ev["epoch"],
                title=f"{cfg.kind} of {ref.label} on {name}: top-1 {ev['top1']:.2f}%")
    store.log_metrics(run_id, {"final_top1": ev["top1"], "final_top5": ev["top5"]}, ev["epoch"], tracking)
    uri = None
    if cfg.registered_model and not cfg.random_init:
        config = classifier_config(ref, ev["classes"], ev["img_size"], name, ev)
        uri = registry.register_classifier(run_id, load_file(str(folder / "model.safetensors")), config,
                                           cfg.registered_model, tracking)
    if not cfg.random_init:
        tag_version(ref, {f"downstream.{name}.top1": ev["top1"]}, tracking)
    return uri
