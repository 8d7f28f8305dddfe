"""A run lost in Ray's machinery, as when Ray's memory monitor kills Train's controller mid checkpoint upload: every
epoch that ended is in MLflow, the run ends FAILED with its reason (tag ``ropim.failure``) in one line, the upload
Ray never registered is removed (the committed checkpoints stay), the same command continues the run; and each
job's first epoch line says what a worker needs in memory."""

from __future__ import annotations

import json
import logging
import shutil
import time
from datetime import datetime

import pytest
import ray
from support import tiny_pretrain

from ropim.cli import main
from ropim.errors import JobFailed
from ropim.tracking import store
from ropim.train import runtime
from ropim.train.driver import run
from ropim.train.failures import failure_reason
from ropim.train.inprocess import LocalWorker
from ropim.train.snapshot import SNAPSHOT, remove_uncommitted

# Ray 2.60's words for a worker its memory monitor killed (raylet), as an actor's death carries them
OOM_DEATH = ("The actor is dead because its worker process has died. Worker exit type: NODE_OUT_OF_MEMORY Worker exit "
             "detail: 1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: "
             "10.0.0.5, ID: 5e1f) was 7.61GB used / 8.00GB limit (0.951)")
TINY = ["pretrain", "--model.depth", "1", "--epochs", "3", "--global_batch_size", "16", "--max_steps_per_epoch", "2",
        "--viz_every", "0", "--log_every", "100", "--num_workers", "1"]


def ray_name() -> str:
    """A checkpoint folder name as Ray Train gives one."""
    return f"checkpoint_{datetime.now():%Y-%m-%d_%H-%M-%S.%f}"


def test_failure_reasons_name_what_failed_and_why():
    from ray.exceptions import OutOfMemoryError, RayActorError
    from ray.train import ControllerError

    actor = "The actor died unexpectedly before finishing this task.\n\tclass_name: TrainController\n\tpid: 7\n"
    assert failure_reason(ControllerError(RayActorError(error_msg=actor + OOM_DEATH))) == (
        "Ray Train's controller failed: killed by Ray's memory monitor, the node ran low on memory (7.61GB of "
        "8.00GB in use)")
    assert failure_reason(RayActorError(error_msg=actor + "Worker exit type: SYSTEM_ERROR Worker exit detail: gone")) \
        == "Ray actor TrainController died: its process exited (SYSTEM_ERROR)"
    assert failure_reason(OutOfMemoryError("Task was killed.")) == (
        "OutOfMemoryError: killed by Ray's memory monitor, the node ran low on memory")
    assert failure_reason(RuntimeError("Training failed:\nthe object store is full\nmore")) == (
        "RuntimeError: the object store is full")


def test_only_folders_ray_never_registered_are_removed(tmp_path):
    committed, uploaded, other = ray_name(), ray_name(), "checkpoint_000001"
    for name in (committed, uploaded, other, "in_process"):
        (tmp_path / name).mkdir()
    assert remove_uncommitted(str(tmp_path / "missing")) == []
    (tmp_path / SNAPSHOT).write_text("{cut sho")  # unreadable: nothing is touched
    assert remove_uncommitted(str(tmp_path)) == [] and (tmp_path / uploaded).is_dir()
    (tmp_path / SNAPSHOT).write_text(json.dumps({"checkpoint_results": [{"checkpoint_dir_name": committed}],
                                                 "latest_checkpoint_result": {"checkpoint_dir_name": committed}}))
    assert remove_uncommitted(str(tmp_path)) == [uploaded]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([committed, other, "in_process", SNAPSHOT])
    (tmp_path / SNAPSHOT).unlink()  # no snapshot: Ray registered nothing, a restart starts over
    assert remove_uncommitted(str(tmp_path)) == [committed]


def test_each_epoch_is_recorded_when_it_ends_before_its_checkpoint_uploads(workdir, monkeypatch, caplog):
    report = LocalWorker.report

    def lost_at_epoch_2(self, metrics, folder, background=False):
        if metrics["epoch"] == 2:
            raise RuntimeError("the node went away during the checkpoint upload")
        report(self, metrics, folder, background)

    monkeypatch.setattr(LocalWorker, "report", lost_at_epoch_2)
    caplog.set_level(logging.INFO, logger="ropim")
    with pytest.raises(RuntimeError, match="went away"):
        run(tiny_pretrain(run_name="lost-upload", num_workers=0, epochs=3, max_steps_per_epoch=2))
    c = store.client()
    found = c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id],
                          "tags.mlflow.runName = 'lost-upload'")[0]
    assert sorted(m.step for m in c.get_metric_history(found.info.run_id, "loss")) == [1, 2]
    assert found.info.status == "FAILED"
    assert found.data.tags["ropim.failure"] == "RuntimeError: the node went away during the checkpoint upload"
    epoch_lines = [r.getMessage() for r in caplog.records if "] epoch " in r.getMessage()]
    assert len(epoch_lines) == 2 and "peak RSS per worker" in epoch_lines[0]  # what a worker needs, once
    assert "peak RSS" not in epoch_lines[1]
    assert found.data.metrics["peak_rss_mb"] > 100


@pytest.mark.faults  # Ray Train's controller lost mid-run
def test_a_controller_killed_for_memory_is_one_line_failed_with_its_epochs_and_no_stray_upload(
        workdir, ray_session, monkeypatch, capsys):
    main([*TINY, "--run_name", "oom", "--stop_after_epochs", "1"], quiet=False)  # epoch 1 committed
    folder = workdir / "ray_results" / "oom"
    committed = sorted(p.name for p in folder.glob("checkpoint_*") if p.is_dir())
    assert len(committed) == 1
    stray = folder / ray_name()

    def controller_lost(trainer):
        """The test double of ``trainer.fit()``: epoch 2's checkpoint reached the run's storage, then Ray's memory
        monitor killed the controller before it registered it."""
        from ray.exceptions import RayActorError
        from ray.train import ControllerError

        shutil.copytree(folder / committed[0], stray)
        raise ControllerError(RayActorError(error_msg=OOM_DEATH))

    monkeypatch.setattr(runtime, "fit_trainer", controller_lost)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([*TINY, "--run_name", "oom"], quiet=False)
    line = str(stop.value.code)
    assert "\n" not in line and line.startswith("ropim pretrain: run oom failed: Ray Train's controller failed: "
                                                "killed by Ray's memory monitor, the node ran low on memory"), line
    assert "marked FAILED (epoch 1/3 recorded last, workers at " in line and f"({stray.name})" in line
    assert line.endswith("continue from its last complete checkpoint with `ropim pretrain --resume oom`")
    assert not stray.exists() and sorted(p.name for p in folder.glob("checkpoint_*") if p.is_dir()) == committed
    c = store.client()
    found = c.get_run(json.loads((folder / "ropim_run.json").read_text())["run_id"])
    assert found.info.status == "FAILED" and found.data.tags["ropim.failure"].startswith("Ray Train's controller")
    assert [m.step for m in c.get_metric_history(found.info.run_id, "loss")] == [1]


@pytest.mark.faults
def test_a_controller_process_killed_mid_run_is_recorded_and_the_same_command_continues(workdir, ray_session):
    cfg = tiny_pretrain(run_name="killed-controller", epochs=3, max_steps_per_epoch=2, num_workers=1)

    def kill_controller_at_epoch_2(config: dict, worker) -> None:  # nested: Ray pickles it by value
        """The pretraining worker, except that it SIGKILLs Train's controller (as Ray's memory monitor does) when
        epoch 2's report starts, then waits to be taken down with it."""
        import os
        import signal
        import time

        import ray
        from ray.util.state import list_actors

        from ropim.train.driver import worker_main

        report = type(worker).report

        def report_or_kill(self, metrics, folder, background=False):
            if metrics["epoch"] == 2:
                alive = list_actors(address=ray.get_runtime_context().gcs_address,  # not another Ray on this machine
                                    filters=[("class_name", "=", "TrainController"), ("state", "=", "ALIVE")])
                os.kill(alive[0].pid, signal.SIGKILL)
                time.sleep(120)
            report(self, metrics, folder, background)

        type(worker).report = report_or_kill  # in this worker process only
        worker_main(config, worker)

    with pytest.raises(JobFailed) as failed:
        run(cfg, worker_fn=kill_controller_at_epoch_2)
    assert "failed: Ray actor TrainController died" in str(failed.value)
    assert "marked FAILED (epoch 2/3 recorded last" in str(failed.value)  # recorded before its upload began
    deadline = time.monotonic() + 120  # the dead run's workers and placement group are freed
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    result = run(cfg)  # the same command continues from epoch 1's checkpoint
    c = store.client()
    assert result.metrics["epoch"] == 3 and c.get_run(result.run_id).info.status == "FINISHED"
    assert sorted(m.step for m in c.get_metric_history(result.run_id, "loss")) == [1, 2, 3]  # each once
