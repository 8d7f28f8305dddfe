"""One Tune trial: a pretraining run on Ray Train whose metrics Tune sees, run by the one job driver
(``ropim.train.driver``) as a child MLflow run of the sweep, nothing registered; with a metric of another job
(``finetune_top1``: the paper's ablation protocol, ``segment_miou``: its Table 3 transfer) the trial then runs that
job (``ropim.train.jobs``) from its encoder and reports the job's score.

A trial restarted after an interruption continues from its latest Train checkpoint in the same MLflow run; a
downstream job already finished is reported, not run again.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path

from ropim.data.sources import one_listing
from ropim.tracking import store
from ropim.train.driver import JobResult, run, worker_main
from ropim.train.jobs import JOBS, prepare
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.pretrain.register import export_encoder
from tune.resources import record_placement_group
from tune.spaces import apply_trial


def trial_driver(config: dict, ctx: dict) -> None:
    """Tune's trainable: train the trial's pretraining config; ``ctx`` holds what every trial of the sweep shares,
    the sweep's listings of its data included (a trial and its workers list no source the sweep listed)."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    with one_listing(ctx.get("listings")):
        trial_id = ray.tune.get_context().get_trial_id()
        uri, storage = ctx["tracking_uri"], ctx["train_storage"]
        pretrain = apply_trial(ctx["pretrain"], config)
        cfg = PretrainConfig.from_dict(pretrain)
        cfg = dataclasses.replace(cfg, run_name=f"trial_{trial_id}", storage_path=storage)
        tags = {"mlflow.parentRunId": ctx["parent_run_id"], "ropim.kind": "sweep-trial", "ropim.sweep": ctx["sweep"],
                "ropim.trial_id": trial_id, "ropim.trial_config": json.dumps(config)}
        # Tune runs a trial once at a time, possibly on another node after a restart: no lock; the sweep says how to
        # resume
        options = {"experiment": ctx["experiment"], "title": f"{ctx['sweep']}/{trial_id}", "tags": tags, "lock": False,
                   "config_artifact": None, "resume": None}
        result = run(prepare(cfg, uri, register=False),
                     worker_fn=functools.partial(record_placement_group, worker_main), register=False,
                     run_options=options, callbacks=[TuneReportCallback()])
        store.set_tags(result.run_id, {"ropim.checkpoint": result.checkpoint_path or ""}, uri)
        metric = ctx.get("metric")
        job = metric.split("_", 1)[0] if metric else None
        if result.earlier and job not in JOBS:  # finished before a stop that Tune's saved state missed: said again
            ray.tune.report({k: v for k, v in result.metrics.items() if isinstance(v, (int, float))})
        if job in JOBS and result.metrics.get("epoch") == cfg.epochs:  # a downstream job's score: finetune_top1, …
            fields = getattr(ctx["recipes"], f"trial_{job}")(pretrain)  # on the trial's seed, data and workers
            score = downstream_score(job, metric.split("_", 1)[1], cfg, result, fields, uri)
            store.log_metrics(result.run_id, {metric: score}, cfg.epochs, uri)
            ray.tune.report({k: v for k, v in result.metrics.items() if isinstance(v, (int, float))} | {metric: score})


def log_encoder(cfg: PretrainConfig, result: JobResult, uri: str) -> str:
    """The trial's final encoder logged on its run (``encoder/``), so that workers on any node read it; its URI."""
    with result.checkpoint_dir() as folder, tempfile.TemporaryDirectory() as tmp:
        for path in export_encoder(folder, cfg, Path(tmp)).iterdir():
            store.log_artifact(result.run_id, path, "encoder", uri)
    return f"runs:/{result.run_id}/encoder"


def downstream_score(job: str, key: str, cfg: PretrainConfig, result: JobResult, fields: dict, uri: str) -> float:
    """The final ``key`` metric (%) of job ``job`` (fine-tune, segment) run from the trial's final encoder with
    ``fields`` (its recipe, budget and data; nothing registered), tracked in the store ``uri``."""
    encoder = log_encoder(cfg, result, uri)
    downstream = JOBS[job].config.from_dict({**fields, "encoder": encoder, "run_name": f"{cfg.run_name}-{job}",
                                             "storage_path": cfg.storage_path})
    out = run(prepare(downstream, uri), run_options={"lock": False})  # as the trial's own: Tune runs it once at a time,
    # possibly on another node after a restart, where a lock its first host left would refuse it for good
    store.set_tags(result.run_id, {f"ropim.{job}_run": out.run_id}, uri)
    return float(out.metrics[key])
