"""One Tune trial: a Ray Train pretraining run whose metrics Tune sees, tracked as a child MLflow run of the sweep;
with ``metric finetune_top1`` (the paper's ablation protocol) the trial then fine-tunes its encoder and reports
val top-1; with ``metric segment_miou`` it trains UperNet on its encoder and reports val mIoU.

A trial restarted after an interruption continues from its latest Train checkpoint in the same MLflow run; a
fine-tune already finished is reported, not run again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path

from ropim.tracking import store
from ropim.tracking.runs import open_run
from ropim.train.config import FinetuneConfig, PretrainConfig
from ropim.train.finetune import finetune
from ropim.train.pretrain import export_encoder, loop_inputs, worker_main
from ropim.train.runtime import FitResult, fit
from ropim.train.segment_config import SegmentConfig
from ropim.train.segment_job import segment
from tune.resources import record_placement_group
from tune.spaces import apply_trial


def trial_driver(config: dict, ctx: dict) -> None:
    """Tune's trainable: train the trial's pretraining config; ``ctx`` holds what every trial of the sweep shares."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = ray.tune.get_context().get_trial_id()
    uri, storage = ctx["tracking_uri"], ctx["train_storage"]
    cfg = PretrainConfig.from_dict(apply_trial(ctx["pretrain"], config))
    cfg = dataclasses.replace(cfg, run_name=f"trial_{trial_id}", storage_path=storage)
    tags = {"mlflow.parentRunId": ctx["parent_run_id"], "ropim.kind": "sweep-trial", "ropim.sweep": ctx["sweep"],
            "ropim.trial_id": trial_id, "ropim.trial_config": json.dumps(config)}
    with open_run(experiment=ctx["experiment"], name=cfg.run_name, title=f"{ctx['sweep']}/{trial_id}",
                  storage_path=storage, config=cfg.to_dict(), tags=tags, uri=uri,
                  lock=False) as run:  # Tune runs a trial once at a time, possibly on another node after a restart
        loop_config, datasets = loop_inputs(cfg, run.run_id, uri)
        result = fit(functools.partial(record_placement_group, worker_main), loop_config, cfg,
                     callbacks=[TuneReportCallback()], datasets=datasets, storage_path=storage)
        store.set_tags(run.run_id, {"ropim.checkpoint": result.checkpoint_path or ""}, uri)
        metric = ctx.get("metric")
        if metric in ("finetune_top1", "segment_miou") and result.metrics.get("epoch") == cfg.epochs:
            score = (finetune_score if metric == "finetune_top1" else segment_score)(
                cfg, result, ctx[metric.split("_")[0]], run.run_id, uri)
            store.log_metrics(run.run_id, {metric: score}, cfg.epochs, uri)
            ray.tune.report({k: v for k, v in result.metrics.items() if isinstance(v, (int, float))}
                            | {metric: score})


def log_encoder(cfg: PretrainConfig, result: FitResult, run_id: str, uri: str) -> str:
    """The trial's final encoder logged on its run (``encoder/``), so that workers on any node read it; its URI."""
    with result.checkpoint_dir() as folder, tempfile.TemporaryDirectory() as tmp:
        for path in export_encoder(folder, cfg, Path(tmp)).iterdir():
            store.log_artifact(run_id, path, "encoder", uri)
    return f"runs:/{run_id}/encoder"


def segment_score(cfg: PretrainConfig, result: FitResult, segment_fields: dict, run_id: str, uri: str) -> float:
    """Val mIoU (%) of UperNet trained on the trial's final encoder with ``segment_fields`` (recipe, budget, data)."""
    seg = SegmentConfig.from_dict({**segment_fields, "encoder": log_encoder(cfg, result, run_id, uri),
                                   "run_name": f"{cfg.run_name}-segment", "storage_path": cfg.storage_path})
    out = segment(seg)
    store.set_tags(run_id, {"ropim.segment_run": out["run_id"]}, uri)
    return float(out["miou"])


def finetune_score(cfg: PretrainConfig, result: FitResult, finetune_fields: dict, run_id: str, uri: str) -> float:
    """Top-1 (%) on the val split of the trial's final encoder fine-tuned with ``finetune_fields`` on the train
    split."""
    log_encoder(cfg, result, run_id, uri)
    ft = FinetuneConfig.from_dict({**finetune_fields, "encoder": f"runs:/{run_id}/encoder",
                                   "run_name": f"{cfg.run_name}-finetune", "storage_path": cfg.storage_path})
    out = finetune(ft)
    store.set_tags(run_id, {"ropim.finetune_run": out["run_id"]}, uri)
    return float(out["top1"])
