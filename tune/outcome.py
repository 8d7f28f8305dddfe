"""What a finished (or interrupted) sweep leaves: one row per trial, the table and plots on the parent MLflow run,
the best trial's encoder registered, and the champion rule applied to it."""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ropim.errors import ConfigError, JobFailed
from ropim.paths import is_uri
from ropim.tracking import registry, store
from ropim.tracking.champion import promote_champion
from ropim.tracking.model_folder import MixedKinds
from ropim.tracking.runs import Run
from ropim.tracking.signals import STOP
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.pretrain.register import register_encoder
from tune import report
from tune.config import METRICS, SweepConfig
from tune.spaces import apply_trial
from tune.study import load_study

DEFAULT_SPLIT = {"val_fraction": 0.2, "split_seed": 0}


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


def collect_rows(grid, cfg: SweepConfig, uri: str, parent_run_id: str) -> list[dict]:
    """One row per trial (in creation order): knob values, metric, status, child MLflow run, final checkpoint."""
    c = store.client(uri)
    exp = c.get_experiment_by_name(cfg.experiment)
    children: dict = {}  # a trial's run: the one its driver recorded, else the newest (a trial killed as its run was
    # made, before it was stored, made another when it started again)
    for r in c.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'",
                           max_results=10_000, order_by=["attributes.start_time DESC"]):
        held = children.get(tid := r.data.tags.get("ropim.trial_id"))
        if held is None or ("ropim.checkpoint" in r.data.tags and "ropim.checkpoint" not in held.data.tags):
            children[tid] = r
    rows, order = [], []
    for result in grid:
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id")
        full = apply_trial(cfg.pretrain, result.config or {})
        epochs_run = metrics.get("epoch")
        if result.error is not None:
            status = "error"
        elif not metrics.get("done") and epochs_run != full["epochs"]:  # a trial that reached its last epoch is
            status = "unfinished"  # done even when Tune's saved state lacks `done` (driver killed as it ended)
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
                store.set_tags(child.info.run_id, {"ropim.early_stopped": f"epoch {epochs_run}"}, uri)
                store.end_run(child.info.run_id, "KILLED", uri)
        rows.append({
            "trial": trial_id, "rho": full["model"]["rho"], "base_lr": full["base_lr"], "epochs": full["epochs"],
            "seed": full["seed"], "knobs": sorted(result.config or {}),
            **{m: metrics.get(m) for m in METRICS if m in metrics}, cfg.metric: metrics.get(cfg.metric),
            "epochs_run": epochs_run, "status": status, "mlflow_run": child.info.run_id if child else None,
            "checkpoint": checkpoint, "config": result.config,
            **{k: v for k, v in (result.config or {}).items() if k not in ("rho", "base_lr", "epochs", "seed")},
        })
    rows = json.loads(json.dumps(rows, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    return [row for _, row in sorted(zip(order, rows, strict=True), key=lambda x: x[0])]


def end_unfinished_trials(cfg: SweepConfig, parent_run_id: str, uri: str) -> int:
    """Mark the sweep's trial runs still RUNNING as KILLED (an interrupted sweep); return how many."""
    c = store.client(uri)
    exp = c.get_experiment_by_name(cfg.experiment)
    running = c.search_runs([exp.experiment_id], max_results=10_000, filter_string=(
        f"tags.mlflow.parentRunId = '{parent_run_id}' and attributes.status = 'RUNNING'"))
    for child in running:
        store.end_run(child.info.run_id, "KILLED", uri)
    return len(running)


def register_best(cfg: SweepConfig, best: dict, parent_run_id: str, uri: str) -> tuple[str, dict]:
    """Register the best trial's final encoder with its score tags; apply the champion rule."""
    from ray.train import Checkpoint

    full = apply_trial(cfg.pretrain, best["config"])
    trial_cfg = PretrainConfig.from_dict(full)
    with Checkpoint(best["checkpoint"]).as_directory() as folder:
        try:
            encoder_uri = register_encoder(trial_cfg, None, best["mlflow_run"], Path(folder), uri)
        except MixedKinds as err:
            raise ConfigError(f"{err.found}, which appeared after the pre-flight (one registered model holds one "
                              f"kind): nothing registered; the sweep keeps its trials: register its best encoder "
                              f"with `{cfg.resume_command} --registered_model {err.suggested}`") from None
    name, version = registry.resolve_version(encoder_uri, uri)
    c = store.client(uri)
    for k, v in {"sweep": cfg.name, "sweep_run_id": parent_run_id, "trial_config": json.dumps(best["config"]),
                 "base_lr": full["base_lr"], "seed": full["seed"]}.items():
        c.set_model_version_tag(name, version, k, str(v))
    m = trial_cfg.model
    decisions = promote_champion(name, version, cfg.protocol(trial_cfg), dataset_key(full["data"]),
                                 float(best[cfg.metric]), higher_is_better=cfg.mode == "max", uri=uri,
                                 model=(m.arch, m.patch_size, m.img_size))
    registry.describe(name, version, uri)  # the card now holds the sweep and its score
    return encoder_uri, decisions


def finish(cfg: SweepConfig, grid, run: Run) -> SweepResult:
    """Table, plots, registration and the parent run's outcome, once Tune returns."""
    parent, uri = run.run_id, run.tracking_uri
    rows = collect_rows(grid, cfg, uri, parent)
    done = [r for r in rows if r["status"] != "unfinished"]
    if len(done) < cfg.n_trials:
        store.set_tags(parent, {"ropim.state": f"interrupted after {len(done)}/{cfg.n_trials} trials"}, uri)
        end_unfinished_trials(cfg, parent, uri)
        run.stop()
        print(f"[sweep] {cfg.name} interrupted after {len(done)}/{cfg.n_trials} trials; continue with "
              f"`{cfg.resume_command}`", flush=True)
        return SweepResult(cfg.name, parent, False, rows)
    errors = sum(r["status"] == "error" for r in rows)
    scored = [r for r in rows if r["status"] != "error" and r[cfg.metric] is not None and r["checkpoint"]]
    if errors and not scored:  # nothing to register: the sweep failed, and --resume runs its failed trials again
        store.set_tags(parent, {"ropim.state": f"failed: {errors} of {len(rows)} trials failed, none scored"}, uri)
        raise JobFailed(f"sweep {cfg.name}: {errors} of {len(rows)} trials failed and none scored (each trial's "
                        "MLflow run and Ray's log above say why); nothing registered; run them again with "
                        f"`{cfg.resume_command}`")
    sign = 1 if cfg.mode == "max" else -1
    best = max(scored, key=lambda r: (r["status"] == "finished", sign * r[cfg.metric]), default=None)
    title = f"{cfg.name}: {cfg.metric} on {dataset_key(cfg.pretrain['data'])}"
    grid_over_rho = cfg.search == "grid" and any(k in cfg.space for k in ("rho", "model.rho"))
    study = None
    if cfg.search == "tpe":
        study = load_study(cfg) or report.rebuild_study(rows, cfg.space, cfg.metric)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if is_uri(cfg.storage_path) else Path(cfg.storage_path) / cfg.name / "report"
        files = report.write_report(rows, cfg.metric, folder, title, grid_over_rho=grid_over_rho, study=study)
        c = store.client(uri)
        for path in files.values():
            c.log_artifact(parent, str(path), "sweep")
        table = files["ablation.md"].read_text()
        files = {k: str(v) for k, v in files.items()}
    encoder_uri, decisions = None, {}
    with STOP.deferred():  # the version registered and the aliases moved are recorded as the outcome before a stop
        if best is not None:
            store.log_metrics(parent, {f"best_{cfg.metric}": best[cfg.metric]}, 0, uri)
            store.set_tags(parent, {"ropim.best_trial": best["trial"], "ropim.best_run_id": best["mlflow_run"]}, uri)
            if cfg.register and cfg.pretrain.get("registered_model", "ropim-encoder"):  # "": register nothing
                encoder_uri, decisions = register_best(cfg, best, parent, uri)
                store.set_tags(parent, {"ropim.encoder_uri": encoder_uri, **{
                    f"ropim.alias.{a}": ("moved: " if moved else "not moved: ") + why
                    for a, (moved, why) in decisions.items()}}, uri)
        store.set_tags(parent, {"ropim.state": f"finished, {errors} failed trials" if errors else "finished"}, uri)
        run.save(finished=True, rows=rows, best=best, encoder_uri=encoder_uri, champion=decisions, table=table)
        run.recorded = True
    print("\n" + table, flush=True)
    if best is not None:
        print(f"[sweep] best: trial {best['trial']} (rho {best['rho']:.3f}, base_lr {best['base_lr']:.2e}, "
              f"epochs {best['epochs']}) {cfg.metric} {best[cfg.metric]:.2f}; MLflow run {best['mlflow_run']}")
    if errors:
        print(f"[sweep] {errors} of {len(rows)} trials failed (status error above; their MLflow runs say why); the "
              f"best of the {len(scored)} scored is taken", flush=True)
    for alias, (moved, why) in decisions.items():
        print(f"[sweep] alias {alias}: {'moved to' if moved else 'not moved to'} {encoder_uri} ({why})")
    print(f"[sweep] parent MLflow run {parent}; encoder {encoder_uri}; artifacts under sweep/", flush=True)
    return SweepResult(cfg.name, parent, True, rows, best, encoder_uri, decisions, table, files)
