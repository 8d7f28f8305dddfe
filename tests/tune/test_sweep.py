"""Sweeps on Ray Tune: a rho grid and an interrupted TPE sweep (tiny model, 1 CPU worker per trial), the
parent/child MLflow runs, table and plot artifacts, the registered best encoder and the champion alias rule."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
from argparse import ArgumentError
from pathlib import Path

import pytest
import ray
import torch
import yaml
from mlflow.tracking import MlflowClient
from ray.tune import Callback
from ray.util.placement_group import PlacementGroup, placement_group_table

from ropim.cli import PRESETS as ROPIM_PRESETS
from ropim.errors import ConfigError
from ropim.tracking import registry, store
from ropim.tracking.run_meta import read_run_meta, write_run_meta
from tune import report
from tune.config import SweepConfig
from tune.driver import run_sweep
from tune.outcome import SweepResult
from tune.preflight import prepare
from tune.resources import PG_FOLDER, release, release_all
from tune.spaces import apply_trial, n_grid_points, to_tune, validate_space
from tune.study import load_study
from tune.sweep import config_from_args, main
from tune.sweep import parser as sweep_parser
from tune.sweep import run as run_sweep_command

TINY = ["--workers-per-trial", "1", "--cpus-per-worker", "0.5", "--model.depth", "1", "--global_batch_size", "16",
        "--max_steps_per_epoch", "3", "--warmup_epochs", "0", "--log_every", "100", "--viz_every", "0"]
RHOS = [0.07, 0.14, 0.25, 0.5]
SWEPT = [0.14, 0.5]
RHO_ARGV = ["--preset", "rho_ablation", "--space", json.dumps({"rho": {"grid": SWEPT}}), *TINY, "--epochs", "2",
            "--base_lr", "0.064", "--name", "rho"]


# ------------------------------------------------------------------------------------------- no Ray needed


def test_spaces_validate_and_convert():
    base = {"model": {"rho": 0.14}, "base_lr": 1e-3, "epochs": 4, "seed": 0}
    space = {"rho": {"grid": RHOS}, "seed": {"grid": [0, 1]}}
    assert validate_space(space, "grid", base) is space and n_grid_points(space) == 8
    assert to_tune(space)["rho"] == {"grid_search": RHOS}
    assert apply_trial(base, {"rho": 0.25, "base_lr": 2e-3})["model"]["rho"] == 0.25
    bad = [({"rho": {"grid": [0.1, 1.5]}}, "grid", "rho: values must lie in"),
           ({"rho": {"grid": [0.1]}}, "tpe", "need search=grid"),
           ({"model.depthh": {"choice": [1]}}, "grid", "not a pretraining config field"),
           ({"base_lr": {"loguniform": [0, 1]}}, "tpe", "needs \\[low, high\\]"),
           ({"base_lr": {"normal": [0, 1]}}, "tpe", "KIND one of")]
    for sp, search, msg in bad:
        with pytest.raises(ValueError, match=msg):
            validate_space(sp, search, base)


def test_cli_builds_config_and_rejects_bad_input_before_ray(workdir, capsys):
    cfg = config_from_args(["--preset", "tpe", "--num-samples", "5", "--max-concurrent", "1", *TINY,
                               "--model.depth", "2", "--name", "x"])
    assert (cfg.search, cfg.scheduler, cfg.num_samples, cfg.max_concurrent) == ("tpe", "asha", 5, 1)
    assert cfg.pretrain["model"]["depth"] == 2 and cfg.pretrain["num_workers"] == 1
    assert cfg.pretrain["eval_every"] == 1  # the preset's override: ASHA needs intermediate kNN
    demo = yaml.safe_load((ROPIM_PRESETS / "pretrain" / "digits_demo.yaml").read_text())
    assert cfg.pretrain["epochs"] == 8 != demo["epochs"]  # the sweep preset's one schedule for every trial
    assert cfg.pretrain["model"] == {**cfg.pretrain["model"], **demo["model"], "depth": 2}  # preset, then flags
    assert cfg.max_epochs == 8 and cfg.n_trials == 5
    # ASHA reads the metric in each epoch's report to Tune: evaluations inline, not beside training (MLflow only)
    assert prepare(cfg).pretrain["eval_async"] is False
    assert prepare(config_from_args(["--num-samples", "2", *TINY])).pretrain.get("eval_async", True) is True

    from ropim.cli import main as ropim_main

    with pytest.raises(SystemExit):
        ropim_main(["sweep", "--preset", "rho_ablation", "--num-samples", "2", *TINY, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["space"] == {"rho": {"grid": RHOS}} and printed["num_samples"] == 2 and printed["num_workers"] == 1
    assert prepare(config_from_args(["--num-samples", "2", *TINY])).pretrain["eval_every"] == demo["epochs"]  # last
    with pytest.raises(SystemExit, match="rho: values must lie in"):
        main(["--space", '{"rho": {"grid": [0.07, 1.2]}}', *TINY])
    with pytest.raises(SystemExit, match=r"space knob 'epochs' at 0: epochs=0: must be an integer ≥ 1"):
        main(["--space", '{"epochs": {"choice": [0, 4]}}', "--search", "tpe", *TINY])
    with pytest.raises(SystemExit, match="space knob 'epochs' with scheduler=asha: ASHA compares trials at the same"):
        main(["--preset", "tpe", "--space", '{"epochs": {"choice": [2, 4]}}', *TINY])  # long schedules cut half-way
    with pytest.raises(SystemExit, match="scheduler=asha needs"):
        main(["--scheduler", "asha", *TINY])
    with pytest.raises(SystemExit, match="unknown --preset 'nope'"):
        main(["--preset", "nope"])
    with pytest.raises(SystemExit, match="--resume ghost: no sweep"):
        main(["--resume", "ghost"])
    assert not (workdir / "ray_results").exists()  # nothing started, nothing tracked:
    assert [e.name for e in store.client().search_experiments()] == ["Default"]


def test_resume_changes_only_what_may_change_and_refuses_the_rest(workdir, capsys):
    """``--resume NAME`` with other flags: the resumable ones (register, registered_model) change the stored sweep,
    said in one line; any other whose value differs from the stored one is refused in one line naming it. Before,
    every other flag was ignored without a word (``--resume s --epochs 9`` ran the stored epochs)."""
    from ropim.cli import main as ropim_main
    from ropim.tracking.run_meta import write_run_meta

    stored = prepare(config_from_args(["--preset", "rho_ablation", *TINY, "--epochs", "2", "--name", "s"]))
    write_run_meta("ray_results", "s", {"run_id": "r", "config": stored.to_dict()})
    assert config_from_args(["--resume", "s"]).to_dict() == stored.to_dict()
    same = ["--resume", "s", "--preset", "rho_ablation", *TINY, "--epochs", "2"]  # as stored: nothing changes
    assert config_from_args(same).to_dict() == stored.to_dict()
    assert stored.pretrain["eval_every"] == 2  # the pre-flight's: kNN at the last epoch only
    typed_again = [*same, "--eval_every", "0", "--storage_path", "ray_results"]  # the original's own flags, relative
    assert config_from_args(typed_again).to_dict() == stored.to_dict()  # before: refused, eval_every=0 (stored 2)
    capsys.readouterr()
    changed = config_from_args(["--resume", "s", "--registered_model", "other", "--no-register"])
    assert changed.pretrain == {**stored.pretrain, "registered_model": "other"} and not changed.register
    assert changed.to_dict() == {**stored.to_dict(), "pretrain": changed.pretrain, "register": False}
    assert capsys.readouterr().out == ("[sweep] --resume s: register True -> False, registered_model 'ropim-encoder' "
                                       "-> 'other' (typed); the rest as stored\n")
    refusals = [(["--epochs", "9"], "epochs=9 (stored 2)"),
                (["--model.rho", "0.3", "--metric", "linear_top1"],
                 "metric='linear_top1' (stored 'knn_top1'), model.rho=0.3 (stored 0.142"),
                (["--preset", "tpe"], "scheduler='asha' (stored 'none')"),
                (["--finetune.epochs", "3"], "finetune.epochs=3 (stored ")]
    for flags, named in refusals:
        with pytest.raises(SystemExit) as err:
            ropim_main(["sweep", "--resume", "s", *flags])
        line = str(err.value)
        assert line.startswith("ropim sweep: --resume s: ") and named in line, line
        assert "cannot change when continuing a sweep (only register, registered_model may)" in line, line
    assert not store.client().search_experiments(filter_string="name = 'ropim-sweep'")  # nothing started


def test_the_same_sweep_again_with_another_concurrency_is_refused(workdir, monkeypatch):
    """Ray Tune's restore keeps the stored concurrency (``Tuner.restore`` takes no TuneConfig): a re-run that asks
    for another is refused in one line before Ray starts, instead of running with the old one without a word."""
    from ropim.errors import ConfigError
    from ropim.tracking.run_meta import write_run_meta

    argv = ["--preset", "rho_ablation", *TINY, "--name", "conc", "--max-concurrent", "1"]
    write_run_meta("ray_results", "conc", {"run_id": "r", "config": prepare(config_from_args(argv)).to_dict()})
    import tune.driver

    monkeypatch.setattr(tune.driver, "ray_session", lambda **_: pytest.fail("Ray was to start"))  # refused before
    with pytest.raises(ConfigError, match=r"a run named 'conc' already exists under .* with a different config "
                                          r"\(max_concurrent\); continue it as stored with `ropim sweep --resume conc"):
        run_sweep(config_from_args([*argv, "--max-concurrent", "2"]))


def test_linear_probe_objective(workdir):
    """--metric linear_top1 turns the linear probe on in every trial; the probe scores real features."""
    from ropim.core.model import ROPIM
    from ropim.train.downstream import frozen_scores
    from ropim.train.pretrain.config import PretrainConfig

    cfg = config_from_args(["--metric", "linear_top1", *TINY, "--name", "lin"])
    assert not cfg.pretrain["eval_linear_probe"]
    cfg = prepare(cfg)
    assert cfg.pretrain["eval_linear_probe"] and cfg.mode == "max"
    assert PretrainConfig.from_dict(cfg.pretrain).protocol("linear_top1") == "linear_top1"
    with pytest.raises(ArgumentError, match="metric"):
        config_from_args(["--metric", "loss", *TINY])

    pretrain = PretrainConfig.from_dict(cfg.pretrain)
    torch.manual_seed(0)
    scores = frozen_scores(ROPIM(pretrain.model).encoder, 32, pretrain.data, pretrain.knn_k)
    # a random-init ViT's features are far from chance on digits (10 classes), under 100%
    assert set(scores) == {"knn_top1", "linear_top1"} and 30 < scores["linear_top1"] < 100


def test_report_writes_tables_and_plots(tmp_path):
    rows = [{"trial": f"a_{i:05d}", "rho": rho, "base_lr": 1e-3 * (i + 1), "epochs": 2, "seed": s,
             "knn_top1": 50 + 10 * rho + s, "epochs_run": 2, "status": "finished", "mlflow_run": f"r{i}"}
            for i, (rho, s) in enumerate((r, s) for r in RHOS for s in (0, 1))]
    space = {"rho": {"uniform": [0.05, 0.6]}, "base_lr": {"loguniform": [1e-4, 1e-1]}}
    files = report.write_report(rows, "knn_top1", tmp_path, "t", grid_over_rho=True,
                                study=report.rebuild_study(rows, space, "knn_top1"))
    assert {p.name for p in tmp_path.iterdir()} == set(files) == {
        "ablation.md", "ablation.csv", "results.json", "metric_vs_rho.png", "metric_by_trial.png",
        "param_importances.png", "importances.json"}
    md = files["ablation.md"].read_text()
    assert "| ρ=0.07 | ρ=0.14 | ρ=0.25 | ρ=0.5 |" in md and "**55.50** ± 0.50" in md
    assert files["ablation.csv"].read_text().splitlines()[0] == \
        "trial,rho,base_lr,epochs,seed,knn_top1,epochs_run,status,mlflow_run"
    assert set(json.loads(files["importances.json"].read_text())) == {"rho", "base_lr"}


# ------------------------------------------------------------------------------------------------- on Ray


def _children(parent: str) -> list:
    c = store.client()
    exp = c.get_experiment_by_name("ropim-sweep")
    return c.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'")


def _artifacts(run_id: str) -> set[str]:
    return {f.path for f in store.client().list_artifacts(run_id, "sweep")}


@pytest.fixture(scope="module")
def rho_sweep_run(workdir, ray_session) -> tuple[SweepResult, list[str], str]:
    """The rho_ablation preset on two of its rho values (the preset's four are checked where it is parsed), run as
    ``ropim sweep`` runs it; with the sweep names of every SweepConfig.validate call in this process meanwhile, and
    what it printed."""
    validated, validate, printed = [], SweepConfig.validate, io.StringIO()
    parser = sweep_parser()
    ns = parser.instantiate(parser.parse_args(RHO_ARGV))
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(printed):
        mp.setattr(SweepConfig, "validate", lambda self: validated.append(self.name) or validate(self))
        result = run_sweep_command(ns)
    print(printed.getvalue())  # shown where the test fails
    return result, validated, printed.getvalue()


@pytest.fixture(scope="module")
def rho_sweep(rho_sweep_run) -> SweepResult:
    return rho_sweep_run[0]


def test_rho_grid_sweep_tracks_reports_and_registers(rho_sweep, rho_sweep_run):
    r = rho_sweep
    assert rho_sweep_run[1] == ["rho"]  # the pre-flight validated the sweep; the driver ran it without again
    ended = [line for line in rho_sweep_run[2].splitlines() if re.match(r"\[sweep\] rho: trial \S+ ended", line)]
    assert len(ended) == 2 and re.search(r"; about \d+\.\d min left$", ended[0]) and "left" not in ended[1], ended
    assert "Configuration for experiment" not in rho_sweep_run[2] and "tensorboard" not in rho_sweep_run[2]  # Tune's
    assert r.complete and sorted(row["rho"] for row in r.rows) == SWEPT
    assert all(row["status"] == "finished" and row["seed"] == 0 and row["epochs_run"] == 2 for row in r.rows)
    assert all(0 < row["knn_top1"] <= 100 for row in r.rows)

    c = store.client()
    parent = c.get_run(r.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["ropim.kind"] == "sweep"
    assert parent.data.metrics["best_knn_top1"] == max(row["knn_top1"] for row in r.rows) == r.best["knn_top1"]
    children = _children(r.parent_run_id)
    assert sorted(ch.data.params["model.rho"] for ch in children) == [str(x) for x in SWEPT]
    by_run = {row["mlflow_run"]: row for row in r.rows}
    for ch in children:
        assert ch.info.status == "FINISHED"
        assert ch.data.metrics["knn_top1"] == pytest.approx(by_run[ch.info.run_id]["knn_top1"])
    assert {"sweep/ablation.md", "sweep/ablation.csv", "sweep/metric_vs_rho.png"} <= _artifacts(r.parent_run_id)
    assert "| ρ=0.14 | ρ=0.5 |" in r.table
    assert all(any((Path(row["checkpoint"]).parent / PG_FOLDER).iterdir()) for row in r.rows)  # recorded

    name, version = registry.resolve_version(r.encoder_uri)
    mv = c.get_model_version(name, version)
    assert mv.tags["run_id"] == r.best["mlflow_run"] and float(mv.tags["rho"]) == r.best["rho"]
    assert (mv.tags["metric"], mv.tags["metric_dataset"]) == ("knn_top1@k=20", "digits")
    assert float(mv.tags["metric_value"]) == r.best["knn_top1"]
    assert registry.resolve_version(f"models:/{name}@champion") == (name, version)
    assert r.champion["champion"] == (True, "no version held 'champion'")
    assert registry.resolve_version(f"models:/{name}@champion-vit_t8-32") == (name, version)  # digits_demo's shape


def test_a_sweep_continued_after_it_registered_registers_nothing_again(rho_sweep, workdir):
    """Killed between registering its best encoder and recording that (``ray job stop``'s SIGKILL, a second Ctrl+C):
    its parent run RUNNING, its record without the outcome. The same command again finds the version it made and
    the aliases that version holds."""
    name, version = registry.resolve_version(rho_sweep.encoder_uri)
    made = [str(v.version) for v in registry.versions(name)]
    meta = read_run_meta("ray_results", "rho")
    store.client().update_run(rho_sweep.parent_run_id, status="RUNNING")
    write_run_meta("ray_results", "rho", {k: v for k, v in meta.items()
                                          if k not in ("finished", "best", "encoder_uri", "champion")})

    again = run_sweep_command(sweep_parser().instantiate(sweep_parser().parse_args(RHO_ARGV)))
    assert again.encoder_uri == rho_sweep.encoder_uri
    assert [str(v.version) for v in registry.versions(name)] == made
    assert again.champion["champion"] == (True, f"v{version} already holds 'champion'")
    assert registry.resolve_version(f"models:/{name}@champion") == (name, version)
    assert store.client().get_run(rho_sweep.parent_run_id).info.status == "FINISHED"
    assert read_run_meta("ray_results", "rho")["finished"]


def test_placement_groups_of_stopped_trials_are_freed(ray_session, tmp_path):
    """The safety net for trials Tune stopped: recorded placement groups are removed, removed ones skipped."""
    from ray.util.placement_group import placement_group, placement_group_table

    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready(), timeout=60)
    folder = tmp_path / "trial_x" / PG_FOLDER
    folder.mkdir(parents=True)
    (folder / pg.id.hex()).touch()
    assert release_all(str(tmp_path)) == 1 and placement_group_table(pg)["state"] == "REMOVED"
    assert release(str(tmp_path / "trial_x")) == 0 and release(str(tmp_path / "nothing")) == 0


class InterruptAfterFirstTrial(Callback):
    """Records trial starts; when the first trial completes, does what Ctrl+C does (Tune saves and returns)."""

    def __init__(self, folder: Path):
        self.folder = str(folder)

    def on_trial_start(self, iteration, trials, trial, **info):
        phase = "resumed" if os.path.exists(f"{self.folder}/interrupted") else "first"
        with open(f"{self.folder}/starts.txt", "a") as f:
            f.write(f"{phase} {trial.trial_id}\n")

    def on_trial_complete(self, iteration, trials, trial, **info):
        marker = Path(self.folder) / "interrupted"
        if not marker.exists():
            marker.write_text(trial.trial_id)
            assert signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None), "Tune's handler is missing"
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.mark.faults
def test_interrupted_tpe_sweep_resumes_and_worse_sweep_keeps_champion(rho_sweep, workdir, tmp_path):
    space = {"rho": {"uniform": [0.05, 0.6]}, "base_lr": {"loguniform": [50.0, 200.0]}}
    cfg = config_from_args(["--preset", "tpe", "--num-samples", "2", "--max-concurrent", "1", "--space",
                               json.dumps(space), *TINY, "--epochs", "2", "--name", "tpe"])
    first = run_sweep(cfg, callbacks=[InterruptAfterFirstTrial(tmp_path)])
    done_first = (tmp_path / "interrupted").read_text()
    assert not first.complete and first.encoder_uri is None
    assert store.client().get_run(first.parent_run_id).info.status == "KILLED"
    study = load_study(prepare(cfg))
    completed = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(completed) >= 1

    second = run_sweep(cfg)  # the same command again: restores the Tune experiment
    assert second.complete and second.parent_run_id == first.parent_run_id
    starts = (tmp_path / "starts.txt").read_text().split("\n")
    assert f"first {done_first}" in starts and f"resumed {done_first}" not in starts  # not re-run
    assert [s for s in starts if s.startswith("first ")] == [f"first {done_first}"]  # one at a time: the other trial
    # started after the restore
    assert len(second.rows) == 2 and all(r["status"] != "unfinished" for r in second.rows)
    assert len({r["mlflow_run"] for r in second.rows}) == len(_children(second.parent_run_id)) == 2
    ended = {r.info.run_id: r.info.status for r in _children(second.parent_run_id)}  # ASHA let them end at max_t:
    assert [(r["status"], ended[r["mlflow_run"]]) for r in second.rows] == [("finished", "FINISHED")] * 2  # not killed
    resumed_study = load_study(prepare(cfg))
    assert len(resumed_study.trials) == 2  # the trial run after the restore is in the same study
    for t in completed:  # the study's history survived the interruption
        assert any(u.params == t.params and u.value == t.value for u in resumed_study.trials)
    assert {"sweep/metric_by_trial.png", "sweep/param_importances.png", "sweep/ablation.csv"} <= \
        _artifacts(second.parent_run_id)

    # every trial of this sweep diverges (lr ≥ 1.5): it is worse, so `champion` stays where the rho sweep put it
    assert second.best["knn_top1"] < rho_sweep.best["knn_top1"]
    assert second.champion["champion"][0] is False and "does not beat" in second.champion["champion"][1]
    assert second.champion["champion-digits"][0] is False
    name, champion = registry.resolve_version(rho_sweep.encoder_uri)
    assert registry.resolve_version(f"models:/{name}@champion") == (name, champion)
    loser = registry.resolve_version(second.encoder_uri)[1]
    assert MlflowClient().get_model_version(name, loser).tags["alias.champion"].startswith("not moved")

    again = run_sweep(cfg)  # a finished sweep is not run (or registered) twice
    assert again.encoder_uri == second.encoder_uri and again.rows == second.rows


@pytest.mark.slow  # a sweep whose trials fine-tune (54 s)
def test_finetune_objective_is_the_papers_protocol(rho_sweep, workdir, segment_sweep_job):
    """--metric finetune_top1: each trial fine-tunes its own encoder (the sweep's recipe, the trial's data and seed)
    after its last epoch; the row, the child run and the registered version carry that score, kNN is reported beside
    it. One trial (a grid of one rho, seed 4 where the sweep's base is 3: before, every trial fine-tuned on the base's
    seed): how trials are compared and registered is the rho sweep's test. The segmentation objective's sweep runs
    meanwhile in another process."""
    with pytest.raises(Exception, match="ASHA has no intermediate values"):
        prepare(config_from_args(["--metric", "finetune_top1", "--scheduler", "asha", "--eval_every", "1", *TINY]))
    space = {"rho": {"grid": SWEPT[:1]}, "seed": {"grid": [4]}}
    cfg = config_from_args(["--metric", "finetune_top1", "--space", json.dumps(space), *TINY,
                            "--epochs", "1", "--seed", "3", "--base_lr", "0.064", "--finetune.epochs", "1",
                            "--finetune.max_steps_per_epoch", "3", "--name", "ft"])
    assert cfg.finetune["batch_size"] == 32 and cfg.finetune["base_lr"] == 0.02  # the preset's digits recipe
    classifiers = len(store.client().search_model_versions("name = 'ropim-classifier'"))
    r = run_sweep(cfg)
    assert r.complete and len(r.rows) == 1 and r.rows[0]["seed"] == 4
    c = store.client()
    for row in r.rows:
        assert 0 < row["finetune_top1"] <= 100 and 0 < row["knn_top1"] <= 100
        trial = c.get_run(row["mlflow_run"])
        assert trial.data.metrics["finetune_top1"] == pytest.approx(row["finetune_top1"])
        ft = c.get_run(trial.data.tags["ropim.finetune_run"])
        assert ft.info.status == "FINISHED" and ft.data.metrics["top1"] == pytest.approx(row["finetune_top1"])
        assert ft.data.tags["ropim.encoder_uri"] == f"runs:/{row['mlflow_run']}/encoder"
        assert json.loads(ft.data.params["seed"]) == row["seed"]
    assert r.best["finetune_top1"] == r.rows[0]["finetune_top1"]
    assert "finetune_top1 (%) by rho" in r.table and "knn_top1 (%) by rho" in r.table
    mv = c.get_model_version(*registry.resolve_version(r.encoder_uri))
    from ropim.train.pretrain.config import PretrainConfig

    assert mv.tags["metric"] == cfg.protocol(PretrainConfig.from_dict(cfg.pretrain))  # finetune_top1@recipe=…
    assert mv.tags["metric"].startswith("finetune_top1@recipe=")
    assert float(mv.tags["metric_value"]) == r.best["finetune_top1"]
    assert len(c.search_model_versions("name = 'ropim-classifier'")) == classifiers  # trials register no classifier


SEGMENT = ["--segment.data.canvases", "20", "--segment.data.canvas_size", "32", "--segment.crop_size", "32",
           "--segment.epochs", "1", "--segment.batch_size", "2", "--segment.max_steps_per_epoch", "1",
           "--segment.channels", "8", "--segment.aux_channels", "8", "--segment.viz_images", "0"]
SEGMENT_SWEEP = ["--metric", "segment_miou", "--space", json.dumps({"rho": {"grid": SWEPT[:1]}}), *TINY,
                 "--epochs", "1", *SEGMENT, "--name", "seg", "--registered_model", ""]  # "": as --no-register


@pytest.fixture(scope="module")
def segment_sweep_job(ray_session, workdir):
    """`ropim sweep --metric segment_miou` in a fresh process, started before the fine-tune objective's sweep runs in
    this one: two sweeps at once on one Ray cluster and one MLflow store, as two users would start them."""
    with open(workdir / "seg.out", "w") as out, open(workdir / "seg.err", "w") as err:  # files: a pipe would fill
        job = subprocess.Popen([sys.executable, "-m", "ropim.cli", "sweep", *SEGMENT_SWEEP], cwd=workdir, text=True,
                               env={**os.environ, "RAY_ADDRESS": ray_session}, stdout=out, stderr=err)
    yield job
    job.kill()


@pytest.mark.slow  # a sweep whose trials segment, in a process of its own
def test_segmentation_objective_trains_upernet_on_each_trials_encoder(segment_sweep_job, workdir):
    """--metric segment_miou: after its last epoch each trial trains UperNet on its own encoder (the sweep's
    segmentation recipe and data, the trial's workers and seed) and reports val mIoU, which Tune optimises."""
    with pytest.raises(Exception, match="ASHA has no intermediate values"):
        prepare(config_from_args(["--metric", "segment_miou", "--scheduler", "asha", "--eval_every", "1", *TINY]))
    cfg = prepare(config_from_args(SEGMENT_SWEEP))
    assert cfg.segment["crop_size"] == 32 and cfg.segment["data"]["canvases"] == 20
    assert segment_sweep_job.wait(timeout=600) == 0, (workdir / "seg.err").read_text()[-3000:]
    c = store.client()
    [parent] = c.search_runs([c.get_experiment_by_name("ropim-sweep").experiment_id],
                             filter_string="tags.`ropim.sweep` = 'seg' and tags.`ropim.kind` = 'sweep'")
    [trial] = _children(parent.info.run_id)
    assert parent.info.status == trial.info.status == "FINISHED"
    miou = trial.data.metrics["segment_miou"]
    assert 0 <= miou <= 100 and parent.data.metrics["best_segment_miou"] == miou
    seg_run = c.get_run(trial.data.tags["ropim.segment_run"])
    assert seg_run.info.status == "FINISHED" and seg_run.data.metrics["miou"] == pytest.approx(miou)
    assert seg_run.data.tags["ropim.encoder_uri"] == f"runs:/{trial.info.run_id}/encoder"
    assert "segment_miou (%) by rho" in (workdir / "seg.out").read_text()
    assert not c.search_model_versions(f"run_id='{trial.info.run_id}'")  # registered_model ""
    assert "ropim.encoder_uri" not in parent.data.tags and "encoder None" in (workdir / "seg.out").read_text()


@pytest.mark.faults
def test_sigterm_ends_a_sweep_and_its_trial_killed_and_keeps_it_resumable(ray_session, workdir):
    import time

    args = ["sweep", "--space", '{"rho": {"grid": [0.25]}}', *TINY, "--epochs", "1000", "--max_steps_per_epoch", "1",
            "--name", "termed", "--no-register"]
    job = subprocess.Popen([sys.executable, "-m", "ropim.cli", *args], cwd=workdir, text=True,
                           env={**os.environ, "RAY_ADDRESS": ray_session}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 300
        while not list(workdir.glob("ray_results/termed/train/*/checkpoint_manager_snapshot.json")):  # committed
            assert job.poll() is None and time.time() < deadline, job.stderr.read()[-3000:] if job.poll() else "slow"
            time.sleep(0.5)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGTERM, err[-3000:]
    said = [line for line in err.splitlines() if "stopped by" in line]  # Ray may log the trial's end after it
    assert len(said) == 1 and "termed stopped by SIGTERM" in said[0], err[-3000:]
    assert "continue with: ropim sweep --resume termed" in said[0]
    c = store.client()
    runs = c.search_runs([c.get_experiment_by_name("ropim-sweep").experiment_id],
                         filter_string="tags.`ropim.sweep` = 'termed'")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"KILLED"}  # the parent and its trial
    assert not c.search_model_versions(f"run_id='{runs[0].info.run_id}'")
    assert ray.tune.Tuner.can_restore(str(workdir / "ray_results" / "termed"))  # `--resume termed` continues it
    assert "resumed from" not in err, err[-3000:]  # the trial's Train run was not restarted during the stop
    groups = [PlacementGroup(ray.PlacementGroupID(bytes.fromhex(p.name)))  # recorded by the trial's rank 0
              for p in workdir.glob(f"ray_results/termed/train/*/{PG_FOLDER}/*")]
    deadline = time.time() + 30  # Ray frees them once the sweep's job ended
    while any(placement_group_table(g).get("state") not in (None, "REMOVED") for g in groups):
        assert time.time() < deadline, [placement_group_table(g) for g in groups]
        time.sleep(0.5)
    assert groups


class ClassifierRegisteredMeanwhile(Callback):
    """When the trial completes, registers a classifier into ``name`` (the sweep's registered model): another job
    taking the name after the sweep's pre-flight passed."""

    def __init__(self, name: str):
        self.name = name

    def on_trial_complete(self, iteration, trials, trial, **info):
        c = store.client()
        c.create_registered_model(self.name)
        c.create_model_version(self.name, "file:///nowhere", tags={"kind": "classifier"})


@pytest.mark.faults
def test_a_sweep_whose_model_took_classifiers_meanwhile_registers_under_the_name_its_line_gives(ray_session,
                                                                                                 workdir):
    """A classifier version appears in the sweep's registered model while its trials run: the sweep registers nothing
    there and says, in one line, the command that registers its best encoder elsewhere; that command (``--resume``
    with another ``--registered_model``) registers it without running a trial again. Before, ``--resume`` took the
    stored registered_model whatever the command line said, so the sweep could not be registered at all."""
    argv = ["--space", '{"rho": {"grid": [0.25]}}', *TINY, "--epochs", "1", "--name", "late",
            "--registered_model", "late-model"]
    with pytest.raises(ConfigError) as err:
        run_sweep(config_from_args(argv), callbacks=[ClassifierRegisteredMeanwhile("late-model")])
    line = str(err.value)
    assert line.startswith("registered_model=late-model holds classifiers (v1), which appeared after the pre-flight "
                           "(one registered model holds one kind): nothing registered; the sweep keeps its "
                           "trials"), line
    c = store.client()
    assert [v.tags.get("kind") for v in c.search_model_versions("name='late-model'")] == ["classifier"]
    command = line.split("`")[1].split()
    assert command[:3] == ["ropim", "sweep", "--resume"] and command[-2:] == ["--registered_model", "ropim-encoder"]
    trials = {r.info.run_id for r in _children(read_run_meta("ray_results", "late")["run_id"])}
    from ropim.cli import main as ropim_main

    ropim_main(command[1:])
    registered = [v for v in c.search_model_versions("name='ropim-encoder'") if v.tags.get("sweep") == "late"]
    assert len(registered) == 1 and registered[0].tags["kind"] == "encoder" and registered[0].run_id in trials
    assert len(_children(read_run_meta("ray_results", "late")["run_id"])) == 1  # no trial run again
    assert read_run_meta("ray_results", "late")["finished"]


def test_trials_start_from_the_sweeps_listing(workdir, ray_session, monkeypatch):
    """The sweep's pre-flight lists an ImageFolder once, and that listing goes to every trial (Tune's shared ``ctx``,
    and from each trial's driver to its workers): before, each trial walked the tree again, as did each of its
    workers."""
    import numpy as np
    from PIL import Image

    import tune.driver
    from ropim.data.formats import imagefolder
    from ropim.data.sources import one_listing, open_source

    for c in ("a", "b"):
        folder = workdir / "sweep-pics" / c
        folder.mkdir(parents=True)
        for i in range(16):
            Image.fromarray(np.full((8, 8, 3), i + 40 * (c == "b"), np.uint8)).save(folder / f"{i}.png")
    calls, real = [], imagefolder.source
    monkeypatch.setattr(imagefolder, "source", lambda cfg, *a: calls.append(cfg.source) or real(cfg, *a))
    shared = {}

    def tuner(cfg, ctx, callbacks):
        shared.update(ctx)
        raise KeyboardInterrupt  # a stop before any trial: the sweep ends as a stopped one

    monkeypatch.setattr(tune.driver, "tuner", tuner)
    with pytest.raises(KeyboardInterrupt):
        run_sweep_command(sweep_parser().instantiate(sweep_parser().parse_args(
            ["--preset", "rho_ablation", *TINY, "--data.source", "sweep-pics", "--name", "listed"])))
    assert calls == [str(workdir / "sweep-pics")]  # the pre-flight's walk, the only one
    (key, source), = shared["listings"].items()
    with one_listing(shared["listings"]):  # as trial_driver starts
        assert open_source(key[0], key[1]) is source and len(calls) == 1
