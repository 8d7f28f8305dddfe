"""Running a sweep on Ray Tune: every trial a Ray Train pretraining run (``tune.trial``), the sweep a parent MLflow
run; then the outcome (``tune.outcome``): table, plots, best encoder registered, champion rule.

Re-running the same sweep name (or ``--resume NAME``) continues an interrupted sweep from its Tune experiment
folder: finished trials are kept, unfinished ones restart from their latest Train checkpoint, and the Optuna
study (in its own storage beside the experiment) keeps its history.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from ray.tune.search.optuna import OptunaSearch

from ropim.errors import ConfigError
from ropim.tracking.runs import Run, default_run_name, open_run
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.config import FinetuneConfig, PretrainConfig
from ropim.train.runtime import ray_session
from tune.config import SweepConfig, default_concurrency, grid_seeds
from tune.outcome import SweepResult, finish
from tune.resources import ReleaseEndedTrials, release_all
from tune.spaces import apply_trial, to_tune
from tune.study import study_storage
from tune.trial import trial_driver

# A trial whose driver is stopped (interrupt, ASHA) before its Train run reports ends with a result holding only
# its config; Tune's strict check then fails the whole sweep although the missing metric is expected. Every
# finished trial still reports the metric (the table and the registry read it from the trial rows).
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")

DRIVER_RESOURCES = {"CPU": 0, "memory": 100 * 1024**2}  # the trial's driver; its Train workers hold the CPUs


class MetricOptunaSearch(OptunaSearch):
    """OptunaSearch that ignores intermediate results without the metric (epochs between evaluations)."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self.metric in result:
            super().on_trial_result(trial_id, result)


def prepare(cfg: SweepConfig) -> SweepConfig:
    """Name the sweep, make local paths absolute (trials run in other folders), evaluate at the final epoch
    at least, and validate the sweep and every value each knob can take, before Ray starts."""
    pretrain = json.loads(json.dumps(cfg.pretrain))
    source = pretrain["data"]["source"]
    if source != "digits" and "://" not in source and not os.path.isabs(source) and os.path.exists(source):
        pretrain["data"]["source"] = os.path.abspath(source)
    if cfg.scheduler == "asha" and pretrain.get("eval_every", 0) < 1:
        raise ConfigError("scheduler=asha needs the metric at intermediate epochs: add --eval_every 1")
    if pretrain.get("eval_every", 0) < 1:
        pretrain["eval_every"] = int(max(cfg.max_epochs, pretrain["epochs"]))  # kNN on the final epoch only
    if cfg.metric == "linear_top1":
        pretrain["eval_linear_probe"] = True
    storage = cfg.storage_path if "://" in cfg.storage_path else str(Path(cfg.storage_path).absolute())
    cfg = dataclasses.replace(cfg, pretrain=pretrain, storage_path=storage,
                              name=cfg.name or default_run_name(cfg.preset))
    cfg.validate()
    base = PretrainConfig.from_dict(pretrain).validate()
    for knob, dist in cfg.space.items():
        for value in next(iter(dist.values())):
            PretrainConfig.from_dict(apply_trial(pretrain, {knob: value})).validate()
    finetune = FinetuneConfig.from_dict(cfg.trial_finetune(pretrain)).validate() if cfg.metric == "finetune_top1" \
        else None
    from ropim.data.datasets import count_images

    n_train = count_images(base.data, "train")
    if n_train < base.global_batch_size:
        raise ConfigError(f"global_batch_size={base.global_batch_size} exceeds the training split ({n_train} images)")
    if finetune is not None and n_train < finetune.batch_size:
        raise ConfigError(f"finetune.batch_size={finetune.batch_size} exceeds the training split ({n_train} images)")
    return cfg


def tuner(cfg: SweepConfig, ctx: dict, callbacks: list | None):
    """The Tune experiment of the sweep: restored from its folder when one exists."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    trainable = tune.with_resources(tune.with_parameters(trial_driver, ctx=ctx), DRIVER_RESOURCES)
    path = f"{cfg.storage_path}/{cfg.name}"
    if tune.Tuner.can_restore(path):
        print(f"[sweep] resuming {path}: finished trials are kept", flush=True)
        return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True)
    search_alg = scheduler = None
    if cfg.search == "tpe":
        search_alg = MetricOptunaSearch(metric=cfg.metric, mode=cfg.mode, seed=cfg.search_seed,
                                        study_name=cfg.name, storage=study_storage(cfg))
    if cfg.scheduler == "asha":
        scheduler = ASHAScheduler(time_attr="epoch", metric=cfg.metric, mode=cfg.mode, max_t=cfg.max_epochs,
                                  grace_period=cfg.grace_period, reduction_factor=cfg.reduction_factor)
    space = cfg.space
    num_samples = cfg.num_samples
    if cfg.search == "grid" and "seed" not in space:  # grid: samples are seeds, the same for every grid point
        space, num_samples = grid_seeds(space, cfg.pretrain["seed"], cfg.num_samples), 1
    return tune.Tuner(
        trainable,
        param_space=to_tune(space),
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    max_concurrent_trials=ctx["max_concurrent"]),
        run_config=tune.RunConfig(name=cfg.name, storage_path=cfg.storage_path,
                                  callbacks=[ReleaseEndedTrials(ctx["train_storage"]), *(callbacks or [])]),
    )


def run_sweep(cfg: SweepConfig, *, callbacks: list | None = None) -> SweepResult:
    """Run (or continue) the sweep; write the table and plots to the parent run; register the best encoder."""
    cfg = prepare(cfg)
    uri = tracking_uri()
    check_tracking(uri)
    params = {k: v for k, v in cfg.to_dict().items() if k != "pretrain"} | {"pretrain": cfg.pretrain}
    with open_run(experiment=cfg.experiment, name=cfg.name, storage_path=cfg.storage_path, config=cfg.to_dict(),
                  resumable=("max_concurrent",), params=params, config_artifact="sweep/config.json", uri=uri,
                  tags={"ropim.kind": "sweep", "ropim.sweep": cfg.name, "ropim.preset": cfg.preset}) as run:
        meta = run.meta
        if run.finished:
            print(f"[sweep] {cfg.name} already finished (MLflow run {run.run_id}); best encoder "
                  f"{meta.get('encoder_uri')}")
            return SweepResult(cfg.name, run.run_id, True, meta["rows"], meta.get("best"), meta.get("encoder_uri"),
                               meta.get("champion", {}), meta.get("table", ""))
        print(f"[sweep] {cfg.name}: {cfg.n_trials} trials ({cfg.search}), MLflow parent run {run.run_id} at {uri}",
              flush=True)
        with ray_session():
            return run_trials(cfg, run, callbacks)


def run_trials(cfg: SweepConfig, run: Run, callbacks: list | None) -> SweepResult:
    """Run the Tune experiment in this Ray session, then ``finish`` it."""
    import ray

    p = cfg.pretrain
    concurrency = cfg.max_concurrent or default_concurrency(ray.cluster_resources(), p["num_workers"],
                                                            p["cpus_per_worker"], p["use_gpu"])
    ctx = {"pretrain": p, "parent_run_id": run.run_id, "tracking_uri": run.tracking_uri, "experiment": cfg.experiment,
           "sweep": cfg.name, "train_storage": f"{cfg.storage_path}/{cfg.name}/train", "max_concurrent": concurrency,
           "metric": cfg.metric, "finetune": cfg.trial_finetune(p)}
    if p["eval_every"] > 1 and (cfg.search == "tpe" or cfg.scheduler == "asha"):
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # epochs between evaluations lack the metric
    try:
        grid = tuner(cfg, ctx, callbacks).fit()
    finally:  # no trial of this sweep runs now: free what stopped trials' Train runs still hold
        if freed := release_all(ctx["train_storage"]):
            print(f"[sweep] freed {freed} placement group(s) left by stopped trials", flush=True)
    return finish(cfg, grid, run)
