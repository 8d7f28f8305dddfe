"""A run registers its model once. A job stopped between making the version and recording it (a second Ctrl+C,
``ray job stop``'s SIGKILL 3 s after its SIGTERM, the OOM killer), or whose store lost the reply to the request that
made it, leaves the version without the run's record of it; continuing the run finds that version again instead of
registering the same weights a second time."""

from __future__ import annotations

import mlflow
import pytest
from support import tiny_pretrain

from ropim.tracking import registry, store
from ropim.tracking.run_meta import read_run_meta, write_run_meta
from ropim.train.driver import run


def unrecord(name: str, tag: str = "ropim.encoder_uri") -> None:
    """Put run ``name`` (under ./ray_results) back in the state a kill leaves after its version was made: the MLflow
    run RUNNING, neither its tag nor its metadata naming the version (nor anything else ``record`` writes)."""
    meta = read_run_meta("ray_results", name)
    c = store.client()
    c.update_run(meta["run_id"], status="RUNNING")
    c.delete_tag(meta["run_id"], tag)
    write_run_meta("ray_results", name, {k: v for k, v in meta.items()
                                         if k not in ("model_uri", "checkpoint", "metrics", "finished")})


def test_a_job_continued_after_its_version_was_made_registers_nothing_again(workdir, capsys):
    cfg = tiny_pretrain(run_name="made", num_workers=0, epochs=1, max_steps_per_epoch=1)
    first = run(cfg)
    assert first.model_uri == "models:/ropim-encoder/1"
    unrecord("made")

    again = run(cfg)
    assert again.model_uri == first.model_uri
    assert [str(v.version) for v in registry.versions("ropim-encoder")] == ["1"]
    assert f"[pretrain] registered encoder {first.model_uri}" in capsys.readouterr().out
    meta = read_run_meta("ray_results", "made")
    assert meta["model_uri"] == first.model_uri  # recorded this time
    assert store.client().get_run(meta["run_id"]).info.status == "FINISHED"


def test_a_registration_retried_after_a_lost_reply_makes_one_version(workdir, monkeypatch):
    """The store made the version, then the reply failed as a busy sqlite store fails: the retry finds it."""
    made = mlflow.register_model
    calls = []

    def reply_lost(*args, **kwargs):
        calls.append(made(*args, **kwargs))
        if len(calls) == 1:
            raise mlflow.exceptions.MlflowException("(sqlite3.OperationalError) database is locked")
        return calls[-1]

    monkeypatch.setattr(mlflow, "register_model", reply_lost)
    result = run(tiny_pretrain(run_name="lost-reply", num_workers=0, epochs=1, max_steps_per_epoch=1,
                               registered_model="lost-reply"))
    assert len(calls) == 1  # the retry asked the store first
    assert [str(v.version) for v in registry.versions("lost-reply")] == ["1"]
    assert result.model_uri == "models:/lost-reply/1"


def test_runs_register_versions_of_their_own(workdir):
    """The lookup is by run: another run's registration is not taken for this one's."""
    a = run(tiny_pretrain(run_name="own-a", num_workers=0, epochs=1, max_steps_per_epoch=1, registered_model="own"))
    b = run(tiny_pretrain(run_name="own-b", num_workers=0, epochs=1, max_steps_per_epoch=1, registered_model="own"))
    assert (a.model_uri, b.model_uri) == ("models:/own/1", "models:/own/2")


def test_a_job_stopped_between_logging_and_registering_logs_its_model_once(workdir, monkeypatch):
    """A stop after the model was logged to the run, before its version was made: the run is not left FINISHED (it
    was, and the job continuing it reported it finished with nothing registered), and continuing it registers the
    model it logged, not a second copy of it."""
    made = mlflow.register_model

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mlflow, "register_model", stopped)
    cfg = tiny_pretrain(run_name="logged", num_workers=0, epochs=1, max_steps_per_epoch=1, registered_model="logged")
    with pytest.raises(KeyboardInterrupt):
        run(cfg)
    run_id, c = read_run_meta("ray_results", "logged")["run_id"], store.client()
    assert c.get_run(run_id).info.status == "KILLED"  # not ended FINISHED by logging its model: it registered nothing
    monkeypatch.setattr(mlflow, "register_model", made)
    result = run(cfg)
    models = c.search_logged_models([c.get_run(run_id).info.experiment_id], filter_string=f"source_run_id = '{run_id}'")
    assert [m.name for m in models] == ["encoder"]
    assert result.model_uri == "models:/logged/1"
    assert registry.load_encoder_files(result.model_uri)[1]["arch"]  # the version reads back whole


def test_a_job_killed_once_its_outcome_was_recorded_is_reported_finished(workdir, capsys):
    """Killed between recording its outcome and ending its MLflow run: the same command reports it (and ends the run
    FINISHED) instead of starting its workers again to train nothing."""
    cfg = tiny_pretrain(run_name="recorded", num_workers=0, epochs=1, max_steps_per_epoch=1)
    first = run(cfg)
    run_id = read_run_meta("ray_results", "recorded")["run_id"]
    store.client().update_run(run_id, status="RUNNING")  # the kill's state: recorded, not ended
    capsys.readouterr()
    again = run(cfg)
    assert again.earlier and again.model_uri == first.model_uri
    assert "[pretrain] run recorded already finished" in capsys.readouterr().out
    assert store.client().get_run(run_id).info.status == "FINISHED"
