"""Running a sweep on Ray Tune: every trial a Ray Train pretraining run (``tune.trial``), the sweep a parent MLflow
run; then the outcome (``tune.outcome``): table, plots, best encoder registered, champion rule.

Re-running the same sweep name (or ``--resume NAME``) continues an interrupted sweep from its Tune experiment
folder: finished trials are kept, unfinished ones restart from their latest Train checkpoint, and the Optuna
study (in its own storage beside the experiment) keeps its history.
"""

from __future__ import annotations

import math
import os

from optuna.samplers import TPESampler
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search.optuna import OptunaSearch

from ropim.checks import DATA_CPUS, waiting_note
from ropim.data.sources import listings, one_listing
from ropim.tracking.runs import Run, open_run
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.runtime import ray_session, worker_cause
from tune.config import SweepConfig
from tune.data_stop import StopAtDataError, TrialDataError, sweep_stopped
from tune.outcome import SweepResult, end_unfinished_trials, finish
from tune.preflight import prepare
from tune.progress import SweepProgress
from tune.resources import ReleaseEndedTrials, release_all
from tune.spaces import grid_seeds, to_tune
from tune.study import study_storage
from tune.trial import trial_driver

DRIVER_RESOURCES = {"CPU": 0, "memory": 100 * 1024**2}  # the trial's driver; its Train workers hold the CPUs
# the stored sweep's fields a continued sweep may change: what ``--resume`` lets the command line change
# (``tune.sweep.RESUMABLE``: registration). Not max_concurrent: ``Tuner.restore`` keeps the stored TuneConfig
CHANGEABLE = ("register", "pretrain.registered_model")


def default_concurrency(cluster: dict, num_workers: int, cpus_per_worker: float, use_gpu: bool,
                        ingest: str = "torch") -> int:
    """How many trials' worker groups fit the cluster at once (at least 1); with ``ingest`` ray_data each trial also
    leaves its Ray Data tasks ``DATA_CPUS``: trials whose workers held every CPU would read no data."""
    per_trial = num_workers * cpus_per_worker + (DATA_CPUS if ingest == "ray_data" else 0)
    fits = math.floor(cluster.get("CPU", 1) / max(per_trial, 1e-9))
    if use_gpu:
        fits = min(fits, math.floor(cluster.get("GPU", 0) / num_workers))
    return max(1, fits)


class MetricOptunaSearch(OptunaSearch):
    """OptunaSearch that ignores intermediate results without the metric (epochs between evaluations)."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self.metric in result:
            super().on_trial_result(trial_id, result)


class FinishingASHA(ASHAScheduler):
    """ASHA that judges a trial only before its last epoch (``epochs``, or the trial's own when the sweep samples
    them). ASHA's top rung can be that epoch itself (``max_t`` = grace_period × factorᵏ), and with ``eval_every`` > 1
    or a downstream metric the last result can be a trial's first past a rung: stopped there, the trial's driver was
    killed while recording its run, which stayed RUNNING."""

    def __init__(self, *, epochs: int, **kwargs) -> None:
        super().__init__(stop_last_trials=False, **kwargs)
        self.epochs = epochs

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if result.get("epoch", 0) >= trial.config.get("epochs", self.epochs):
            return TrialScheduler.CONTINUE  # the trial ends by itself, recorded
        return super().on_trial_result(tune_controller, trial, result)


def tpe_sampler(cfg: SweepConfig) -> TPESampler:
    """The sweep's TPE sampler: ``cfg.n_startup`` random trials, then TPE, seeded by ``cfg.search_seed``."""
    return TPESampler(seed=cfg.search_seed, n_startup_trials=cfg.n_startup)


def tuner(cfg: SweepConfig, ctx: dict, callbacks: list | None):
    """The Tune experiment of the sweep: restored from its folder when one exists."""
    from ray import tune

    trainable = tune.with_resources(tune.with_parameters(trial_driver, ctx=ctx), DRIVER_RESOURCES)
    path = f"{cfg.storage_path}/{cfg.name}"
    if tune.Tuner.can_restore(path):
        print(f"[sweep] resuming {path}: finished trials are kept", flush=True)
        return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True)
    search_alg = scheduler = None
    if cfg.search == "tpe":
        search_alg = MetricOptunaSearch(metric=cfg.metric, mode=cfg.mode, sampler=tpe_sampler(cfg),
                                        study_name=cfg.name, storage=study_storage(cfg))
    if cfg.scheduler == "asha":
        scheduler = FinishingASHA(epochs=cfg.pretrain["epochs"], time_attr="epoch", metric=cfg.metric, mode=cfg.mode,
                                  max_t=cfg.max_epochs, grace_period=cfg.grace_period,
                                  reduction_factor=cfg.reduction_factor)
    space = cfg.space
    num_samples = cfg.num_samples
    if cfg.search == "grid" and "seed" not in space:  # grid: samples are seeds, the same for every grid point
        space, num_samples = grid_seeds(space, cfg.pretrain["seed"], cfg.num_samples), 1
    return tune.Tuner(
        trainable,
        param_space=to_tune(space),
        tune_config=tune.TuneConfig(search_alg=search_alg, scheduler=scheduler, num_samples=num_samples,
                                    max_concurrent_trials=ctx["max_concurrent"]),
        run_config=tune.RunConfig(name=cfg.name, storage_path=cfg.storage_path, verbose=0,  # SweepProgress's lines
                                  callbacks=[SweepProgress(cfg, ctx["max_concurrent"]),
                                             ReleaseEndedTrials(ctx["train_storage"]), StopAtDataError(),
                                             *(callbacks or [])]),
    )


@one_listing()  # the pre-flight's listing of the data goes to every trial (``ctx["listings"]``)
def run_sweep(cfg: SweepConfig, *, callbacks: list | None = None) -> SweepResult:
    """Run (or continue) the sweep (``prepare``d here unless it is already); write the table and plots to the parent
    run; register the best encoder."""
    cfg = prepare(cfg)
    uri = tracking_uri()
    check_tracking(uri)
    params = {k: v for k, v in cfg.to_dict().items() if k != "pretrain"} | {"pretrain": cfg.pretrain}
    with open_run(experiment=cfg.experiment, name=cfg.name, storage_path=cfg.storage_path, config=cfg.to_dict(),
                  resumable=CHANGEABLE, params=params, config_artifact="sweep/config.json", uri=uri,
                  tags={"ropim.kind": "sweep", "ropim.sweep": cfg.name, "ropim.preset": cfg.preset},
                  resume=cfg.resume_command) as run:
        meta = run.meta
        if run.finished:  # or its outcome recorded by a sweep killed before its run was ended
            print(f"[sweep] {cfg.name} already finished (MLflow run {run.run_id}); best encoder "
                  f"{meta.get('encoder_uri')}")
            return SweepResult(cfg.name, run.run_id, True, meta["rows"], meta.get("best"), meta.get("encoder_uri"),
                               meta.get("champion", {}), meta.get("table", ""))
        print(f"[sweep] {cfg.name}: {cfg.n_trials} trials ({cfg.search}), MLflow parent run {run.run_id} at {uri}",
              flush=True)
        with ray_session(paths={"data.source": cfg.pretrain["data"]["source"], "storage_path": cfg.storage_path}):
            return run_trials(cfg, run, callbacks)


def run_trials(cfg: SweepConfig, run: Run, callbacks: list | None) -> SweepResult:
    """Run the Tune experiment in this Ray session, then ``finish`` it."""
    import ray

    # A trial whose driver is stopped (interrupt, ASHA) before its Train run reports ends with a result holding only
    # its config; Tune's strict check then fails the whole sweep although the missing metric is expected. Every
    # finished trial still reports the metric (the table and the registry read it from the trial rows).
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # SIGINT ends a sweep as SIGTERM does (``ropim.tracking.signals``): the parent run and its unfinished trials
    # KILLED, the Tune experiment kept for ``--resume``; Tune's own SIGINT handler would return as if it had ended.
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    # SweepProgress says what the sweep does. Tune's console output (Ray's RAY_AIR_NEW_OUTPUT) would add, even at
    # verbose 0, its experiment table and a TensorBoard command naming Ray's temporary session folder (the trials'
    # records are in MLflow, Tune's files in storage_path/<name>); its legacy output prints nothing at verbose 0.
    # Set in this process only, once Ray is up: Ray's workers keep their own.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    p, total = cfg.pretrain, ray.cluster_resources()
    cfg.check_data_cpus(total.get("CPU", 0.0), "the Ray cluster")
    concurrency = cfg.max_concurrent or default_concurrency(total, p["num_workers"], p["cpus_per_worker"], p["use_gpu"],
                                                            p["ingest"])
    if note := waiting_note(p["num_workers"], p["cpus_per_worker"], p["use_gpu"], total.get("CPU", 0.0),
                            total.get("GPU", 0.0), "the Ray cluster"):  # trials wait for nodes; say so, and the cost
        more = "" if cfg.max_concurrent or run.continued else "; trials then run one at a time, as counted now: " \
            "give --max-concurrent N to run N at once"  # a continued sweep keeps its concurrency (``Tuner.restore``)
        print(f"[sweep] a trial's {note}{more}", flush=True)
    ctx = {"pretrain": p, "parent_run_id": run.run_id, "tracking_uri": run.tracking_uri, "experiment": cfg.experiment,
           "sweep": cfg.name, "train_storage": f"{cfg.storage_path}/{cfg.name}/train", "max_concurrent": concurrency,
           "metric": cfg.metric, "recipes": cfg,  # each trial's fine-tune / segmentation from it
           "listings": listings()}  # Tune puts ctx in Ray's object store once (``tune.with_parameters``)
    if p["eval_every"] > 1 and (cfg.search == "tpe" or cfg.scheduler == "asha"):
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # epochs between evaluations lack the metric
    try:
        grid = tuner(cfg, ctx, callbacks).fit()
    except KeyboardInterrupt:  # a stop signal: the trials' drivers die with this one, their runs end KILLED here.
        # Their placement groups stay until then: removed now, they would restart the trials' Train runs (Ray frees
        # a job's groups once it ends and their creators are gone)
        end_unfinished_trials(cfg, run.run_id, run.tracking_uri)
        raise
    except Exception as err:  # Tune wraps what its callbacks raise: a trial's data error ends the sweep
        free_stopped_trials(ctx)
        if (met := worker_cause(err, lambda e: isinstance(e, TrialDataError))) is None:
            raise
        raise sweep_stopped(cfg, run, met) from None
    free_stopped_trials(ctx)
    return finish(cfg, grid, run)


def free_stopped_trials(ctx: dict) -> None:
    """Free what stopped trials' Train runs still hold, once Tune stopped every trial (fit returned or raised)."""
    if freed := release_all(ctx["train_storage"]):
        print(f"[sweep] freed {freed} placement group(s) left by stopped trials", flush=True)
