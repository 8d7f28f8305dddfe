"""A sweep ends at the first trial that fails on its data or storage (every trial reads the same, so each would fail
on it in turn, after training up to it); an error of one trial's settings fails that trial only."""

from __future__ import annotations

import re
from types import SimpleNamespace

import cloudpickle
import pytest
from ray.exceptions import RayTaskError
from support import run_cli, undecodable_shard

from ropim.data.decode import BadImageError
from ropim.tracking import store
from ropim.train.checkpoint import NoRoom
from ropim.train.guard import Diverged
from tune.data_stop import StopAtDataError, TrialDataError


def failed_trial(tmp_path, err: BaseException | None) -> SimpleNamespace:
    """A Tune trial that failed on ``err`` (raised in its actor: Tune pickles Ray's task error around it)."""
    path = tmp_path / "error.pkl"
    if err is not None:
        path.write_bytes(cloudpickle.dumps(RayTaskError("train", "Traceback …", err)))
    return SimpleNamespace(trial_id="abc_00001", pickled_error_file=str(path))


@pytest.mark.parametrize("err", [BadImageError("img3.png: cannot decode image (cut short); set data.on_bad_image"),
                                 NoRoom("no space left in storage_path for epoch 2's checkpoint: free space there")])
def test_a_trial_failing_on_the_data_or_storage_ends_the_sweep(tmp_path, err):
    with pytest.raises(TrialDataError, match=re.escape(str(err))) as raised:
        StopAtDataError().on_trial_error(iteration=3, trials=[], trial=failed_trial(tmp_path, err))
    assert raised.value.trial_id == "abc_00001"


def test_tunes_trial_still_keeps_its_pickled_error_where_the_callback_reads_it():
    from ray.tune.experiment import Trial

    assert isinstance(Trial.pickled_error_file, property)  # a Ray upgrade that moves it fails here


@pytest.mark.parametrize("err", [Diverged("loss is nan at step 12: lower base_lr"), RuntimeError("CUDA error"), None])
def test_a_trial_failing_on_its_own_settings_or_a_crash_fails_alone(tmp_path, err):
    StopAtDataError().on_trial_error(iteration=3, trials=[], trial=failed_trial(tmp_path, err))  # raises nothing


@pytest.mark.faults  # a sweep on Ray, stopped, then continued once the data is fixed
def test_a_sweep_on_an_undecodable_image_stops_at_its_first_trial_and_resumes_once_fixed(workdir, ray_session):
    undecodable_shard(workdir / "shards")
    sweep = ["sweep", "--preset", "rho_ablation", "--space", '{"rho": {"grid": [0.14, 0.25, 0.5]}}', "--name",
             "badimg", "--max_concurrent", "1", "--data.source", "shards", "--data.on_bad_image", "fail",
             "--data.val_fraction", "0.1", "--workers-per-trial", "1", "--model.depth", "1", "--global_batch_size", "8",
             "--epochs", "1", "--viz_every", "0", "--no-register"]
    env = {"RAY_ADDRESS": ray_session}
    job = run_cli(*sweep, cwd=workdir, env=env)
    shown = job.stdout + job.stderr
    last = shown.strip().splitlines()[-1]
    assert job.returncode == 1 and "Traceback" not in shown, shown[-3000:]
    assert re.fullmatch(r"ropim sweep: img\d+\.png: cannot decode image .* \(trial \w+ of sweep badimg; every trial "
                        r"reads the same data and storage, so the sweep stopped.*; once fixed, continue with "
                        r"`ropim sweep --resume badimg .*`\)", last), last
    c = store.client()
    runs = c.search_runs([c.get_experiment_by_name("ropim-sweep").experiment_id])
    parent = next(r for r in runs if r.info.run_name == "badimg")
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert parent.info.status == "FAILED" and parent.data.tags["ropim.state"].startswith("failed: trial ")
    assert [r.info.status for r in trials] == ["FAILED"]  # before: each of the 3 trials trained up to the image

    undecodable_shard(workdir / "shards", bad=False)  # the data fixed, the line's command continues the sweep
    resumed = run_cli(*re.search(r"`ropim (sweep --resume .*)`", last)[1].split(), cwd=workdir, env=env)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    runs = c.search_runs([c.get_experiment_by_name("ropim-sweep").experiment_id])
    assert sorted(r.info.status for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id) == [
        "FINISHED"] * 3
    assert c.get_run(parent.info.run_id).info.status == "FINISHED"
