"""A tracking store that stops taking records while a run trains (an MLflow server restarted or down for longer
than MLflow's own retries): training goes on, the records are kept and sent once the store takes them again, each
checkpoint holds them meanwhile (a job continuing from it sends them), and a run is not finished without them."""

from __future__ import annotations

import signal

import pytest
from mlflow.exceptions import MlflowException
from support import tiny_pretrain

from ropim.errors import JobFailed
from ropim.tracking import store
from ropim.tracking.run_meta import read_run_meta
from ropim.tracking.signals import Interrupted
from ropim.train.driver import run

DOWN = MlflowException("API request to endpoint /api/2.0/mlflow/runs/log-batch failed with error code 503 != 200. "
                       "Response body: 'Service Unavailable'")


def outage(monkeypatch, down: set[int], stop_at: int | None = None) -> list[list[int]]:
    """``store.log_epochs`` refuses the calls whose last epoch is in ``down`` (a SIGTERM at ``stop_at``'s);
    returns the epochs of every call taken."""
    taken, log_epochs = [], store.log_epochs

    def logging(run_id, epochs, uri=None):
        last = epochs[-1]["epoch"] if epochs else None
        if last == stop_at:
            raise Interrupted(signal.SIGTERM)
        if last in down:
            raise DOWN
        taken.append([m["epoch"] for m in epochs])
        log_epochs(run_id, epochs, uri)

    monkeypatch.setattr(store, "log_epochs", logging)
    return taken


def recorded(run_id: str, key: str = "loss") -> list[int]:
    return sorted(m.step for m in store.client().get_metric_history(run_id, key))


def test_training_goes_on_while_the_store_is_down_and_sends_what_it_kept(workdir, monkeypatch, caplog):
    """Epochs 2 and 3 end while the store is down: before, the first refused record failed the run."""
    taken = outage(monkeypatch, down={2, 3})
    artifact = store.log_artifact
    monkeypatch.setattr(store, "log_artifact", lambda run_id, path, *a, **k: (_ for _ in ()).throw(DOWN)
                        if "epoch0002" in str(path) else artifact(run_id, path, *a, **k))
    caplog.set_level("INFO", logger="ropim.train")
    result = run(tiny_pretrain(run_name="outage", num_workers=0, epochs=4, max_steps_per_epoch=1, viz_every=1))
    assert result.model_uri is not None and result.metrics["epoch"] == 4
    assert recorded(result.run_id) == [1, 2, 3, 4]  # every epoch once
    assert taken == [[1], [2, 3, 4]]  # sent together once the store took them again
    lines = [r.getMessage() for r in caplog.records if "tracking store" in r.getMessage()]
    down = "(API request to endpoint /api/2.0/mlflow/runs/log-batch failed with error code 503 != 200. Response " \
        "body: 'Service Unavailable')"
    assert lines == [f"[pretrain] epoch 2's pictures not stored: the tracking store did not take them {down}; "
                     "training goes on (said once until it takes them again)",
                     f"[pretrain] the tracking store did not take epoch 2's metrics {down}: training goes on, and "
                     "they are sent with the next epoch's (each checkpoint holds them meanwhile)",
                     "[pretrain] the tracking store took the 2 record(s) it had not, of epochs 2–3"]
    pictures = {f.path for f in store.client().list_artifacts(result.run_id, "pictures")}
    assert "pictures/reconstruction_epoch0002.png" not in pictures
    assert "pictures/reconstruction_epoch0003.png" in pictures


def test_a_store_still_down_costs_one_short_request_an_epoch(workdir, monkeypatch):
    """Each epoch end asks the server's ``/health`` once before sending its pictures and records: while it stays
    down nothing is sent, so no epoch waits out MLflow's retries (about 4 minutes a call with its defaults, at every
    epoch end before). The job's last record is sent whatever the answer (it is strict)."""
    taken = outage(monkeypatch, down={2})
    asked = []
    health = iter([True, True, False, False, True, True])  # epochs 1-6: up, up (but refused), down, down, up, up

    def answers(uri=None, timeout=5.0):
        asked.append(uri)
        return next(health)

    monkeypatch.setattr(store, "answers", answers)
    result = run(tiny_pretrain(run_name="still-down", num_workers=0, epochs=6, max_steps_per_epoch=1, viz_every=1))
    assert taken == [[1], [2, 3, 4, 5], [6]]  # before: [[1], [2, 3], [4], [5], [6]], each refusal after retries
    assert recorded(result.run_id) == [1, 2, 3, 4, 5, 6] and next(health, None) is None
    assert len(asked) == 6  # once an epoch end, though pictures and records both asked (twice before)
    pictures = {f.path for f in store.client().list_artifacts(result.run_id, "pictures")}
    assert {p for p in pictures if "reconstruction" in p} == {f"pictures/reconstruction_epoch000{e}.png"
                                                              for e in (1, 2, 5, 6)}  # not tried while down


def test_the_first_epoch_end_that_finds_the_store_down_sends_nothing(workdir, monkeypatch, caplog):
    """The server goes down during epoch 2: its end asks ``/health``, finds no answer, and neither its pictures nor
    its records are sent. Before, the first refused call of a run waited out MLflow's retries: twice, pictures
    then records, about 8 minutes with MLflow's defaults."""
    tried = []
    for name in ("log_epochs", "log_artifact"):
        real = getattr(store, name)
        monkeypatch.setattr(store, name,
                            lambda *a, _real=real, _name=name, **k: (tried.append(_name), _real(*a, **k))[1])
    health = iter([True, False, True])
    monkeypatch.setattr(store, "answers", lambda uri=None, timeout=5.0: next(health))
    caplog.set_level("INFO", logger="ropim.train")
    result = run(tiny_pretrain(run_name="first-down", num_workers=0, epochs=3, max_steps_per_epoch=1, viz_every=1))
    assert tried.count("log_epochs") == 2  # epoch 1's, then 2 and 3 together: nothing at epoch 2's end
    assert recorded(result.run_id) == [1, 2, 3] and next(health, None) is None
    pictures = {f.path for f in store.client().list_artifacts(result.run_id, "pictures")}
    assert "pictures/reconstruction_epoch0002.png" not in pictures
    assert {"pictures/reconstruction_epoch0001.png", "pictures/reconstruction_epoch0003.png"} <= pictures
    lines = [r.getMessage() for r in caplog.records if "tracking store" in r.getMessage()]
    down = f"(no answer from {store.tracking_uri()})"
    assert lines == [f"[pretrain] epoch 2's pictures not stored: the tracking store did not take them {down}; "
                     "training goes on (said once until it takes them again)",
                     f"[pretrain] the tracking store did not take epoch 2's metrics {down}: training goes on, and "
                     "they are sent with the next epoch's (each checkpoint holds them meanwhile)",
                     "[pretrain] the tracking store took the 1 record(s) it had not, of epoch 2"]


def test_a_job_continuing_from_a_checkpoint_sends_the_records_it_holds(workdir, monkeypatch):
    """The store is down when epoch 2 ends, and the job is stopped at epoch 3: epoch 2's checkpoint holds its record,
    and the same job again (the store back) sends it. Before, the run failed at epoch 2."""
    cfg = tiny_pretrain(run_name="outage-stopped", num_workers=0, epochs=4, max_steps_per_epoch=1)
    with monkeypatch.context() as m:
        outage(m, down={2}, stop_at=3)
        with pytest.raises(KeyboardInterrupt):
            run(cfg)
    result = run(cfg)
    assert recorded(result.run_id) == [1, 2, 3, 4] and result.model_uri is not None


def test_a_run_is_not_finished_while_the_store_holds_none_of_its_last_records(workdir, monkeypatch, caplog):
    """The store is down at the last epoch: the job fails rather than finish and register without its last records;
    the same job again, the store back, sends them from the last checkpoint (not training again) and registers."""
    cfg = tiny_pretrain(run_name="outage-at-end", num_workers=0, epochs=3, max_steps_per_epoch=1)
    with monkeypatch.context() as m:
        taken = outage(m, down={3})
        with pytest.raises(JobFailed) as err:
            run(cfg)
        assert taken == [[1], [2]]
    assert str(err.value) == (f"run outage-at-end: the tracking store {store.tracking_uri()} did not take its last "
                              f"epochs' records ({DOWN}); nothing registered, the run's complete checkpoints kept "
                              "(the latest holds the records the store did not take); once the store answers, "
                              "continue with `ropim pretrain --resume outage-at-end`")
    c = store.client()
    first = c.search_runs([c.get_experiment_by_name(cfg.experiment).experiment_id],
                          filter_string="attributes.run_name = 'outage-at-end'")[0]
    assert first.info.status == "FAILED" and not c.search_model_versions(f"run_id='{first.info.run_id}'")
    taken = outage(monkeypatch, down=set())
    caplog.set_level("INFO", logger="ropim.train")
    result = run(cfg)
    assert taken == [[3]] and "resumed from epoch 3, step 3" in caplog.text  # its last checkpoint's record; no epoch
    # trained again (before, the job failed before epoch 3's checkpoint and trained it again)
    assert result.run_id == first.info.run_id and recorded(result.run_id) == [1, 2, 3] and result.model_uri


def test_a_store_down_when_the_job_ends_on_an_error_does_not_hide_the_error(workdir, monkeypatch, capsys):
    """The run cannot be marked FAILED either (the store is down): the job's own error is what it ends with, and one
    line says the run was not marked. Before, MLflow's error from marking it replaced the job's."""
    from ropim.tracking import runs

    monkeypatch.setattr(runs, "end_run", lambda *a, **k: (_ for _ in ()).throw(DOWN))
    with pytest.raises(ValueError, match="the job's own error"), \
            runs.open_run(experiment="e", name="ends-badly", storage_path="ray_results", config={}) as run:
        raise ValueError("the job's own error")
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"[run] ends-badly: MLflow run {run.run_id} not marked FAILED, the tracking store did not take it "
                    f"({DOWN})"]


def test_a_store_down_when_the_encoder_is_registered_says_how_to_register_it(workdir, monkeypatch):
    """Trained to the end, then the store does not take the encoder: one line, nothing registered; the command it
    names registers it without training again."""
    from ropim.train.pretrain import register

    cfg = tiny_pretrain(run_name="outage-register", num_workers=0, epochs=1, max_steps_per_epoch=1)
    with monkeypatch.context() as m:
        m.setattr(register, "register_encoder", lambda *a, **k: (_ for _ in ()).throw(DOWN))
        with pytest.raises(JobFailed, match=r"^run outage-register: the tracking store .* did not take the encoder "
                                            r"\(API request .*; once the store answers, continue with `ropim pretrain "
                                            r"--resume outage-register`$"):
            run(cfg)
    run_id = read_run_meta("ray_results", "outage-register")["run_id"]
    assert not store.client().search_model_versions(f"run_id='{run_id}'")
    result = run(cfg)
    assert result.run_id == run_id and recorded(run_id) == [1]
    assert [str(v.version) for v in store.client().search_model_versions(f"run_id='{run_id}'")] == \
        [result.model_uri.rsplit("/", 1)[1]]
