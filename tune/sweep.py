"""Sweeps of ROPIM pretraining on Ray Tune: every trial is a Ray Train run and an MLflow run nested under the
sweep's parent run; the best trial's encoder is registered and may take the ``champion`` alias.

    python -m tune.sweep --preset rho_ablation --workers-per-trial 1 --epochs 4
    python -m tune.sweep --preset tpe --num-samples 12 --max-concurrent 2 --model.depth 4

Re-running the same command with the same ``--name`` (or ``--resume NAME``) continues an interrupted sweep from
its Tune experiment folder: finished trials are kept, unfinished ones restart from their latest Train
checkpoint, and the Optuna study (saved with the Tune experiment) keeps its history.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ray.tune.search.optuna import OptunaSearch

from ropim import registry
from ropim.checkpoint import read_run_meta, write_run_meta
from ropim.errors import ConfigError
from ropim.runtime import ray_session
from ropim.train import PretrainConfig, build_trainer, register_checkpoint
from tune import report
from tune.presets import METRICS, PRESETS, SweepConfig, default_concurrency, grid_seeds, preset
from tune.resources import ReleaseEndedTrials, recording_train_loop, release_all
from tune.spaces import apply_trial, to_tune

# A trial whose driver is stopped (interrupt, ASHA) before its Train run reports ends with a result holding only
# its config; Tune's strict check then fails the whole sweep although the missing metric is expected. Every
# finished trial still reports knn_top1 (the table and the registry read it from the trial rows).
os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")

DRIVER_RESOURCES = {"CPU": 0, "memory": 100 * 1024**2}  # the trial's driver; its Train workers hold the CPUs
DEFAULT_SPLIT = {"val_fraction": 0.2, "split_seed": 0}


class MetricOptunaSearch(OptunaSearch):
    """OptunaSearch that ignores intermediate results without the metric (epochs between kNN evaluations)."""

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if self.metric in result:
            super().on_trial_result(trial_id, result)


def trial_driver(config: dict, ctx: dict) -> None:
    """One Tune trial: a Ray Train pretraining run (metrics forwarded to Tune), a child MLflow run of the sweep."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = ray.tune.get_context().get_trial_id()
    uri, storage = ctx["tracking_uri"], ctx["train_storage"]
    cfg = PretrainConfig.from_dict(apply_trial(ctx["pretrain"], config))
    cfg = dataclasses.replace(cfg, run_name=f"trial_{trial_id}", storage_path=storage)
    meta = read_run_meta(storage, cfg.run_name)
    if meta is None:  # a fresh trial
        tags = {"mlflow.parentRunId": ctx["parent_run_id"], "ropim.kind": "sweep-trial", "ropim.sweep": ctx["sweep"],
                "ropim.trial_id": trial_id, "ropim.trial_config": json.dumps(config)}
        run_id = registry.create_run(ctx["experiment"], f"{ctx['sweep']}/{trial_id}", cfg.to_dict(), tags, uri)
        write_run_meta(storage, cfg.run_name, {"run_id": run_id, "config": cfg.to_dict()})
    else:  # restarted after an interruption: Train resumes from the trial's latest checkpoint, same MLflow run
        run_id = meta["run_id"]
        registry.client(uri).update_run(run_id, status="RUNNING")
    try:
        result = build_trainer(cfg, run_id, uri, train_loop=recording_train_loop, callbacks=[TuneReportCallback()],
                               storage_path=storage).fit()
    except BaseException:
        registry.end_run(run_id, "FAILED", uri)
        raise
    registry.set_tags(run_id, {"ropim.checkpoint": result.checkpoint.path if result.checkpoint else ""}, uri)
    registry.end_run(run_id, "FINISHED", uri)


@dataclass
class SweepResult:
    """What a sweep left: the parent MLflow run, one row per trial, the best one, the registry outcome."""

    name: str
    parent_run_id: str
    complete: bool  # False: interrupted; re-run the same command (or --resume NAME) to continue
    rows: list[dict] = field(default_factory=list)
    best: dict | None = None
    encoder_uri: str | None = None
    champion: dict = field(default_factory=dict)  # alias -> (moved, reason)
    table: str = ""
    files: dict = field(default_factory=dict)  # artifact name -> local path


def dataset_key(data: dict) -> str:
    """The data set a metric was measured on: the source, plus the split when it is not the default."""
    split = {k: data.get(k, v) for k, v in DEFAULT_SPLIT.items()}
    if split == DEFAULT_SPLIT:
        return data["source"]
    return data["source"] + "?" + "&".join(f"{k}={v}" for k, v in split.items())


def metric_key(metric: str, pretrain: dict) -> str:
    """The metric with its protocol, e.g. ``knn_top1@k=20`` (kNN top-1 with k = 20 is not k = 10);
    ``linear_top1`` is the linear probe with ``ropim.probe``'s default schedule."""
    return f"{metric}@k={pretrain['knn_k']}" if metric.startswith("knn") else metric


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
                              name=cfg.name or f"{cfg.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    cfg.validate()
    base = PretrainConfig.from_dict(pretrain).validate()
    for knob, dist in cfg.space.items():
        for value in next(iter(dist.values())):
            PretrainConfig.from_dict(apply_trial(pretrain, {knob: value})).validate()
    from ropim.data import build_dataset

    n_train = len(build_dataset(base.data, "train", img_size=base.model.img_size))
    if n_train < base.global_batch_size:
        raise ConfigError(f"global_batch_size={base.global_batch_size} exceeds the training split ({n_train} images)")
    return cfg


def _open_parent(cfg: SweepConfig, uri: str) -> dict:
    """The sweep's metadata (parent MLflow run id, config, outcome): stored when continuing, else new."""
    meta = read_run_meta(cfg.storage_path, cfg.name)
    if meta is None:
        params = {k: v for k, v in cfg.to_dict().items() if k != "pretrain"} | {"pretrain": cfg.pretrain}
        tags = {"ropim.kind": "sweep", "ropim.sweep": cfg.name, "ropim.preset": cfg.preset}
        run_id = registry.create_run(cfg.experiment, cfg.name, params, tags, uri)
        registry.log_text(run_id, json.dumps(cfg.to_dict(), indent=2), "sweep/config.json", uri)
        meta = {"run_id": run_id, "config": cfg.to_dict()}
        write_run_meta(cfg.storage_path, cfg.name, meta)
        return meta
    stored = {k: v for k, v in meta["config"].items() if k != "max_concurrent"}
    wanted = {k: v for k, v in cfg.to_dict().items() if k != "max_concurrent"}
    if stored != wanted:
        changed = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
        raise ConfigError(f"sweep {cfg.name!r} already exists under {cfg.storage_path} with a different config "
                          f"({', '.join(changed)}); continue it with --resume {cfg.name} or pick a new --name")
    if not meta.get("finished"):
        registry.client(uri).update_run(meta["run_id"], status="RUNNING")
    return meta


def _tuner(cfg: SweepConfig, ctx: dict, callbacks: list | None):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    trainable = tune.with_resources(tune.with_parameters(trial_driver, ctx=ctx), DRIVER_RESOURCES)
    path = f"{cfg.storage_path}/{cfg.name}"
    if tune.Tuner.can_restore(path):
        print(f"[sweep] resuming {path}: finished trials are kept", flush=True)
        return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True)
    search_alg = scheduler = None
    if cfg.search == "tpe":
        search_alg = MetricOptunaSearch(metric=cfg.metric, mode=cfg.mode, seed=cfg.search_seed)
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


def collect_rows(grid, cfg: SweepConfig, uri: str, parent_run_id: str) -> list[dict]:
    """One row per trial (in creation order): knob values, metric, status, child MLflow run, final checkpoint."""
    c = registry.client(uri)
    exp = c.get_experiment_by_name(cfg.experiment)
    children = {r.data.tags.get("ropim.trial_id"): r for r in c.search_runs(
        [exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'", max_results=10_000)}
    rows, order = [], []
    for result in grid:
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id")
        full = apply_trial(cfg.pretrain, result.config or {})
        epochs_run = metrics.get("epoch")
        if result.error is not None:
            status = "error"
        elif not metrics.get("done"):
            status = "unfinished"
        else:
            status = "finished" if epochs_run == full["epochs"] else f"stopped early (ASHA) at epoch {epochs_run}"
        # Tune names trial folders <trainable>_<trial_id>_<creation index>_<params>…
        index = re.search(rf"{trial_id}_(\d+)_", Path(result.path or "").name) if trial_id else None
        order.append(int(index.group(1)) if index else len(order) + 10**6)
        child = children.get(trial_id)
        checkpoint = metrics.get("checkpoint_path")
        if child is not None:
            checkpoint = child.data.tags.get("ropim.checkpoint") or checkpoint
            if status.startswith("stopped") and child.info.status == "RUNNING":  # ASHA ended its driver
                registry.set_tags(child.info.run_id, {"ropim.early_stopped": f"epoch {epochs_run}"}, uri)
                registry.end_run(child.info.run_id, "KILLED", uri)
        rows.append({
            "trial": trial_id, "rho": full["model"]["rho"], "base_lr": full["base_lr"], "epochs": full["epochs"],
            "seed": full["seed"], "knobs": sorted(result.config or {}), cfg.metric: metrics.get(cfg.metric),
            "epochs_run": epochs_run, "status": status, "mlflow_run": child.info.run_id if child else None,
            "checkpoint": checkpoint, "config": result.config,
            **{k: v for k, v in (result.config or {}).items() if k not in ("rho", "base_lr", "epochs", "seed")},
        })
    rows = json.loads(json.dumps(rows, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    return [row for _, row in sorted(zip(order, rows, strict=True), key=lambda x: x[0])]


def load_study(sweep_dir: str):
    """The Optuna study OptunaSearch saved with the Tune experiment (its newest searcher state), or None.

    Unpickles a file of this sweep's own experiment folder, as ``Tuner.restore`` itself does."""
    if "://" in sweep_dir:
        return None
    files = sorted(Path(sweep_dir).glob("searcher-state-*.pkl"))  # named by session start time
    if not files:
        return None
    searcher = MetricOptunaSearch()
    searcher.restore(str(files[-1]))
    return searcher._ot_study


def _register_best(cfg: SweepConfig, best: dict, parent_run_id: str, uri: str) -> tuple[str, dict]:
    """Register the best trial's final encoder with its score tags; apply the champion rule."""
    from ray.train import Checkpoint

    full = apply_trial(cfg.pretrain, best["config"])
    trial_cfg = PretrainConfig.from_dict(full)
    encoder_uri = register_checkpoint(Checkpoint(best["checkpoint"]), trial_cfg, best["mlflow_run"], uri)
    name, version = registry.resolve_version(encoder_uri, uri)
    c = registry.client(uri)
    for k, v in {"sweep": cfg.name, "sweep_run_id": parent_run_id, "trial_config": json.dumps(best["config"]),
                 "base_lr": full["base_lr"], "seed": full["seed"]}.items():
        c.set_model_version_tag(name, version, k, str(v))
    decisions = registry.promote_champion(name, version, metric_key(cfg.metric, full), dataset_key(full["data"]),
                                          float(best[cfg.metric]), higher_is_better=cfg.mode == "max", uri=uri)
    return encoder_uri, decisions


def run_sweep(cfg: SweepConfig, *, callbacks: list | None = None) -> SweepResult:
    """Run (or continue) the sweep; write the table and plots to the parent run; register the best encoder."""
    cfg = prepare(cfg)
    uri = registry.tracking_uri()
    registry.check_tracking(uri)
    meta = _open_parent(cfg, uri)
    parent = meta["run_id"]
    if meta.get("finished"):
        print(f"[sweep] {cfg.name} already finished (MLflow run {parent}); best encoder {meta.get('encoder_uri')}")
        return SweepResult(cfg.name, parent, True, meta["rows"], meta.get("best"), meta.get("encoder_uri"),
                           meta.get("champion", {}), meta.get("table", ""))
    print(f"[sweep] {cfg.name}: {cfg.n_trials} trials ({cfg.search}), MLflow parent run {parent} at {uri}", flush=True)
    try:
        with ray_session():
            return _run_trials(cfg, parent, uri, callbacks)
    except BaseException:
        registry.end_run(parent, "FAILED", uri)
        raise


def _run_trials(cfg: SweepConfig, parent: str, uri: str, callbacks: list | None) -> SweepResult:
    """Run the Tune experiment in this Ray session, then ``finish`` it."""
    import ray

    p = cfg.pretrain
    concurrency = cfg.max_concurrent or default_concurrency(ray.cluster_resources(), p["num_workers"],
                                                            p["cpus_per_worker"], p["use_gpu"])
    ctx = {"pretrain": p, "parent_run_id": parent, "tracking_uri": uri, "experiment": cfg.experiment,
           "sweep": cfg.name, "train_storage": f"{cfg.storage_path}/{cfg.name}/train", "max_concurrent": concurrency}
    if p["eval_every"] > 1 and (cfg.search == "tpe" or cfg.scheduler == "asha"):
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # epochs between evaluations lack the metric
    try:
        grid = _tuner(cfg, ctx, callbacks).fit()
    finally:  # no trial of this sweep runs now: free what stopped trials' Train runs still hold
        if freed := release_all(ctx["train_storage"]):
            print(f"[sweep] freed {freed} placement group(s) left by stopped trials", flush=True)
    return finish(cfg, grid, parent, uri)


def finish(cfg: SweepConfig, grid, parent: str, uri: str) -> SweepResult:
    """Table, plots, registration and the parent run's outcome, once Tune returns."""
    rows = collect_rows(grid, cfg, uri, parent)
    done = [r for r in rows if r["status"] != "unfinished"]
    if len(done) < cfg.n_trials:
        registry.set_tags(parent, {"ropim.state": f"interrupted after {len(done)}/{cfg.n_trials} trials"}, uri)
        registry.end_run(parent, "KILLED", uri)
        print(f"[sweep] {cfg.name} interrupted after {len(done)}/{cfg.n_trials} trials; continue with "
              f"`python -m tune.sweep --resume {cfg.name} --storage-path {cfg.storage_path}`", flush=True)
        return SweepResult(cfg.name, parent, False, rows)
    scored = [r for r in rows if r[cfg.metric] is not None and r["checkpoint"]]
    sign = 1 if cfg.mode == "max" else -1
    best = max(scored, key=lambda r: (r["status"] == "finished", sign * r[cfg.metric]), default=None)
    title = f"{cfg.name}: {cfg.metric} on {dataset_key(cfg.pretrain['data'])}"
    grid_over_rho = cfg.search == "grid" and any(k in cfg.space for k in ("rho", "model.rho"))
    study = None
    if cfg.search == "tpe":
        study = load_study(f"{cfg.storage_path}/{cfg.name}") or report.rebuild_study(rows, cfg.space, cfg.metric)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if "://" in cfg.storage_path else Path(cfg.storage_path) / cfg.name / "report"
        files = report.write_report(rows, cfg.metric, folder, title, grid_over_rho=grid_over_rho, study=study)
        c = registry.client(uri)
        for path in files.values():
            c.log_artifact(parent, str(path), "sweep")
        table = files["ablation.md"].read_text()
        files = {k: str(v) for k, v in files.items()}
    encoder_uri, decisions = None, {}
    if best is not None:
        registry.log_metrics(parent, {f"best_{cfg.metric}": best[cfg.metric]}, 0, uri)
        registry.set_tags(parent, {"ropim.best_trial": best["trial"], "ropim.best_run_id": best["mlflow_run"]}, uri)
        if cfg.register:
            encoder_uri, decisions = _register_best(cfg, best, parent, uri)
            registry.set_tags(parent, {"ropim.encoder_uri": encoder_uri, **{
                f"ropim.alias.{a}": ("moved: " if moved else "not moved: ") + why
                for a, (moved, why) in decisions.items()}}, uri)
    errors = sum(r["status"] == "error" for r in rows)
    registry.set_tags(parent, {"ropim.state": f"finished, {errors} failed trials" if errors else "finished"}, uri)
    registry.end_run(parent, "FINISHED", uri)
    write_run_meta(cfg.storage_path, cfg.name, {
        "run_id": parent, "config": cfg.to_dict(), "finished": True, "rows": rows, "best": best,
        "encoder_uri": encoder_uri, "champion": decisions, "table": table})
    print("\n" + table, flush=True)
    if best is not None:
        print(f"[sweep] best: trial {best['trial']} (rho {best['rho']:.3f}, base_lr {best['base_lr']:.2e}, "
              f"epochs {best['epochs']}) {cfg.metric} {best[cfg.metric]:.2f}; MLflow run {best['mlflow_run']}")
    for alias, (moved, why) in decisions.items():
        print(f"[sweep] alias {alias}: {'moved to ' + encoder_uri if moved else 'unchanged'} ({why})")
    print(f"[sweep] parent MLflow run {parent}; encoder {encoder_uri}; artifacts under sweep/", flush=True)
    return SweepResult(cfg.name, parent, True, rows, best, encoder_uri, decisions, table, files)


# ---------------------------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {name:<14} {p['description']}" for name, p in PRESETS.items())
    p = argparse.ArgumentParser(
        prog="ropim sweep", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Sweep ROPIM pretraining with Ray Tune (+ Optuna); each trial is a Ray Train run.",
        epilog=f"sweep presets:\n{lines}\n\nAny other flag overrides the pretraining config as in `ropim pretrain` "
               "(e.g. --model.depth 2 --epochs 4 --data.source PATH --max_steps_per_epoch 20).")
    p.add_argument("--preset", default="rho_ablation", help="sweep preset (below); default rho_ablation")
    p.add_argument("--resume", metavar="NAME", help="continue the sweep NAME (under --storage-path) with its "
                   "stored config; other flags are ignored")
    p.add_argument("--pretrain-preset", help="pretraining preset (ropim/presets/pretrain); default: the sweep "
                   "preset's (digits_demo)")
    p.add_argument("--pretrain-config", action="append", default=[], metavar="YAML", help="pretraining YAML")
    p.add_argument("--num-samples", type=int, help="TPE: trials; grid: seeds per grid point")
    p.add_argument("--max-concurrent", type=int, help="trials at once (default: as many as the CPUs fit)")
    p.add_argument("--workers-per-trial", type=int, help="Ray Train workers per trial (num_workers)")
    p.add_argument("--cpus-per-worker", type=float, help="CPUs per Train worker")
    p.add_argument("--space", type=json.loads, help='search space as JSON, e.g. \'{"rho": {"grid": [0.1, 0.3]}}\'')
    p.add_argument("--scheduler", choices=("none", "asha"), help="override the preset's scheduler")
    p.add_argument("--metric", default="knn_top1", choices=sorted(METRICS),
                   help="objective on the val split: knn_top1 (default) or linear_top1 (linear probe)")
    p.add_argument("--search-seed", type=int, default=0, help="TPE sampler seed")
    p.add_argument("--name", help="sweep name (folder under --storage-path, parent MLflow run name)")
    p.add_argument("--storage-path", default="ray_results", help="where Tune and Train state go")
    p.add_argument("--experiment", default="ropim-sweep", help="MLflow experiment of the parent and child runs")
    p.add_argument("--no-register", action="store_true", help="do not register the best encoder")
    p.add_argument("--print-config", action="store_true", help="print the resolved sweep config and exit")
    return p


def _parse_pretrain(argv: list[str]) -> dict:
    from ropim.cli import _expand_presets, _sub

    parser = _sub(PretrainConfig, "pretraining config of every trial")
    ns = parser.instantiate(parser.parse_args(_expand_presets("pretrain", argv)))
    return PretrainConfig(**{k: v for k, v in ns.items() if k not in ("config", "preset", "__path__")}).to_dict()


def config_from_args(argv: list[str]) -> tuple[SweepConfig, bool]:
    """The sweep config from command-line flags; also whether to only print it."""
    args, rest = _parser().parse_known_args(argv)
    if args.resume:
        meta = read_run_meta(args.storage_path, args.resume)
        if meta is None:
            raise ConfigError(f"--resume {args.resume}: no sweep of that name under --storage-path {args.storage_path}")
        return SweepConfig(**meta["config"]), args.print_config  # Tune restores its own concurrency
    p = preset(args.preset)
    flags = [f"--{k}={json.dumps(v) if isinstance(v, list | dict) else v}"
             for k, v in registry.flatten(p["overrides"]).items()]
    if args.workers_per_trial is not None:
        rest += ["--num_workers", str(args.workers_per_trial)]
    if args.cpus_per_worker is not None:
        rest += ["--cpus_per_worker", str(args.cpus_per_worker)]
    configs = [a for c in args.pretrain_config for a in ("--config", c)]
    pretrain = _parse_pretrain(["--preset", args.pretrain_preset or p["pretrain_preset"], *configs, *flags, *rest])
    cfg = SweepConfig(
        preset=args.preset, search=p["search"], space=args.space or p["space"], metric=args.metric,
        scheduler=args.scheduler or p["scheduler"], num_samples=args.num_samples or p.get("num_samples", 1),
        max_concurrent=args.max_concurrent, search_seed=args.search_seed, name=args.name,
        storage_path=args.storage_path, experiment=args.experiment, register=not args.no_register,
        pretrain=pretrain)
    return cfg, args.print_config


def main(argv: list[str] | None = None) -> SweepResult | None:
    """``python -m tune.sweep`` / ``ropim sweep`` / ``jobs/sweep.py``."""
    try:
        cfg, print_only = config_from_args(list(sys.argv[1:] if argv is None else argv))
        if print_only:
            print(json.dumps(prepare(cfg).to_dict(), indent=2))
            return None
        return run_sweep(cfg)
    except (ConfigError, LookupError, ConnectionError, FileNotFoundError) as err:
        raise SystemExit(f"ropim sweep: {err}") from None


if __name__ == "__main__":
    main()
