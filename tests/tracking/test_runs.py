"""The one run tracker: a named run is created once, continued with the same config, refused with another, reported
when finished, and marked FINISHED, KILLED or FAILED by how its block ends."""

from __future__ import annotations

import pytest

from ropim.errors import ConfigError
from ropim.tracking import store
from ropim.tracking.names import default_run_name
from ropim.tracking.runs import open_run, read_run_meta


def status(run_id: str) -> str:
    return store.client().get_run(run_id).info.status


def test_named_run_is_created_continued_refused_and_reported(workdir):
    cfg = {"epochs": 3, "num_workers": 2, "model": {"rho": 0.14}}
    with open_run(experiment="t", name="a", config=cfg, storage_path="runs", resumable=("num_workers",),
                  tags={"ropim.kind": "test"}, config_artifact="config/a.json") as run:
        assert not run.continued and not run.finished
        run.stop()
    first = run.run_id
    assert status(first) == "KILLED" and read_run_meta("runs", "a")["run_id"] == first
    mlflow_run = store.client().get_run(first)
    assert mlflow_run.data.params["model.rho"] == "0.14" and mlflow_run.data.tags["ropim.kind"] == "test"
    assert [a.path for a in store.client().list_artifacts(first, "config")] == ["config/a.json"]

    with open_run(experiment="t", name="a", config={**cfg, "num_workers": 1}, storage_path="runs",
                  resumable=("num_workers",)) as run:  # a resumable field may change
        assert run.continued and run.run_id == first and status(first) == "RUNNING"
        run.save(outcome="done")
    assert status(first) == "FINISHED" and read_run_meta("runs", "a")["outcome"] == "done"
    assert read_run_meta("runs", "a")["config"] == {**cfg, "num_workers": 1}  # what the next --resume continues on

    with pytest.raises(ConfigError, match=r"already exists .* different config \(epochs\); continue it as stored "
                                          r"with `ropim t --resume a`, or give this one a new name"):
        open_run(experiment="t", name="a", config={**cfg, "epochs": 4}, storage_path="runs",
                 resumable=("num_workers",), resume="ropim t --resume a")
    with pytest.raises(ConfigError, match=r"different config \(model\.rho\)"):  # the field, not its section
        open_run(experiment="t", name="a", config={**cfg, "model": {"rho": 0.5}}, storage_path="runs",
                 resumable=("num_workers",))
    with open_run(experiment="t", name="a", config=cfg, storage_path="runs", resumable=("num_workers",)) as again:
        assert again.finished and again.meta["outcome"] == "done"
    assert status(first) == "FINISHED"  # reporting a finished run leaves it as it was


def test_a_continued_run_keeps_a_nested_resumable_change_for_the_next_resume(workdir):
    """A sweep continued with --registered_model other (``pretrain.registered_model``), stopped, then continued as
    stored: the stored config holds what the last continuation ran with."""
    cfg = {"epochs": 3, "pretrain": {"registered_model": "ropim-encoder", "epochs": 3}}
    with open_run(experiment="t", name="nested", config=cfg, storage_path="runs") as run:
        run.stop()
    changed = {**cfg, "pretrain": {**cfg["pretrain"], "registered_model": "other"}}
    with open_run(experiment="t", name="nested", config=changed, storage_path="runs",
                  resumable=("pretrain.registered_model",)) as run:
        run.stop()
    assert read_run_meta("runs", "nested")["config"] == changed


def test_an_exception_marks_failed_and_ctrl_c_killed(workdir):
    with pytest.raises(RuntimeError), open_run(experiment="t", name="boom", config={}) as run:
        raise RuntimeError("broken")
    assert status(run.run_id) == "FAILED"
    with pytest.raises(KeyboardInterrupt), open_run(experiment="t", name="ctrl-c", config={}) as run:
        raise KeyboardInterrupt
    assert status(run.run_id) == "KILLED"


def test_a_run_its_owner_ended_keeps_that_status_when_the_job_then_fails(workdir, capsys):
    """A stopped sweep marks its trials' runs KILLED; a trial then failing as its workers go leaves it KILLED."""
    with pytest.raises(RuntimeError), open_run(experiment="t", name="trial", config={}) as run:
        store.end_run(run.run_id, "KILLED")  # the sweep's driver, in another process
        raise RuntimeError("the trial's Train workers were lost")
    assert status(run.run_id) == "KILLED"
    assert f"MLflow run {run.run_id} was already ended KILLED, kept" in capsys.readouterr().err


def test_default_names_do_not_collide_within_a_second():
    names = {default_run_name("pretrain") for _ in range(50)}
    assert len(names) == 50 and all(n.startswith("pretrain-") for n in names)


def test_epochs_recorded_again_after_a_restart_keep_their_first_values(workdir):
    run_id = store.create_run("t", "epochs", {})
    store.log_epochs(run_id, [{"epoch": 1, "loss": 0.9}, {"epoch": 2, "loss": 0.8}])
    # restarted from epoch 1's checkpoint: epoch 2 trained again (another value), then epoch 3, and an evaluation
    store.log_epochs(run_id, [{"epoch": 2, "loss": 0.7}, {"epoch": 3, "loss": 0.6}, {"epoch": 2, "knn_top1": 40.0}])
    history = store.client().get_metric_history(run_id, "loss")
    assert [(h.step, h.value) for h in sorted(history, key=lambda h: h.step)] == [(1, 0.9), (2, 0.8), (3, 0.6)]
    assert [h.step for h in store.client().get_metric_history(run_id, "knn_top1")] == [2]


def test_stop_signals_raise_once_then_a_second_signal_exits_at_once(monkeypatch):
    import signal

    from ropim.tracking.signals import STOP, Interrupted

    exits = []

    def exit_now(status: int):
        exits.append(status)
        raise SystemExit(status)

    monkeypatch.setattr("ropim.tracking.signals.os._exit", exit_now)
    before = signal.getsignal(signal.SIGTERM)
    assert STOP.install() and not STOP.install()  # a run opened inside another keeps the outer's handlers
    try:
        with pytest.raises(Interrupted, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
        assert STOP.name() == "SIGTERM" and exits == []
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGINT)  # the second: at once, with 128 + the signal's number
        assert exits == [128 + signal.SIGINT]
    finally:
        STOP.restore()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_signal_during_a_store_call_is_raised_when_the_call_has_written(workdir, capsys):
    """Ctrl+C or SIGTERM in the middle of an MLflow write: the write ends whole, then the job stops; the run is
    marked KILLED at once (an interrupted sqlite commit kept the store locked: marking the run took minutes)."""
    import signal

    from ropim.tracking.signals import Interrupted

    class HalfWay:
        """A client whose write receives SIGTERM half-way through."""

        def __init__(self):
            self.done = []

        def log_batch(self, run_id, metrics=()):
            self.done.append("begun")
            signal.raise_signal(signal.SIGTERM)
            self.done.append("written")
            return "ok"

    writer = HalfWay()
    with pytest.raises(Interrupted, match="SIGTERM"), open_run(experiment="t", name="half", config={"a": 1},
                                                              storage_path="runs") as run:
        store.RetryingClient(writer).log_batch(run.run_id)
    assert writer.done == ["begun", "written"]  # not cut in half
    assert status(run.run_id) == "KILLED"
    assert "half stopped by SIGTERM" in capsys.readouterr().err


def test_a_stop_signal_inside_a_run_ends_it_killed_and_says_how_to_continue(workdir, capsys):
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), open_run(experiment="t", name="sig", config={"a": 1}, storage_path="runs",
                                                    resume="ropim pretrain --resume sig") as run:
        signal.raise_signal(signal.SIGTERM)
    assert status(run.run_id) == "KILLED"
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "sig stopped by SIGTERM" in said and said.endswith("continue with: ropim pretrain --resume sig")
    assert signal.getsignal(signal.SIGTERM) is before and not (workdir / "runs" / "sig" / ".lock").exists()


def test_a_stop_once_the_outcome_is_recorded_names_what_was_registered(workdir, capsys):
    import signal

    with pytest.raises(KeyboardInterrupt), open_run(experiment="t", name="late", config={"a": 1},
                                                    storage_path="runs") as run:
        run.save(model_uri="models:/ropim-encoder/7")  # what the driver records once the version is registered
        run.recorded = True
        signal.raise_signal(signal.SIGTERM)
    assert status(run.run_id) == "FINISHED"
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.endswith(f"once its outcome was recorded: MLflow run {run.run_id} FINISHED, registered "
                         "models:/ropim-encoder/7")


def test_a_model_reference_is_parsed_once_into_its_parts():
    from ropim.tracking.uri import ModelRef

    assert ModelRef.parse("models:/ropim-encoder/3") == ModelRef("models:/ropim-encoder/3", "models",
                                                               name="ropim-encoder", version="3")
    alias = ModelRef.parse("models:/ropim-encoder@champion-vit_b16-224")
    assert (alias.name, alias.alias, alias.version) == ("ropim-encoder", "champion-vit_b16-224", "")
    run = ModelRef.parse("runs:/0a1b/encoder/")
    assert (run.run_id, run.path, run.in_store) == ("0a1b", "encoder", True)
    for other in ("runs/encoder", "s3://bucket/encoder", "~/encoder"):
        assert not ModelRef.parse(other).in_store and ModelRef.parse(other).run_id == ""


def test_a_run_tracked_in_another_store_is_refused_in_one_line(workdir, monkeypatch, tmp_path):
    with open_run(experiment="t", name="elsewhere", config={"epochs": 1}, storage_path="runs"):
        pass
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")  # another folder's store
    with pytest.raises(ConfigError, match=r"run 'elsewhere' under runs is MLflow run [0-9a-f]{32}, which the "
                                          r"tracking store sqlite:///.*other\.db does not hold: run the command where"):
        open_run(experiment="t", name="elsewhere", config={"epochs": 1}, storage_path="runs")
