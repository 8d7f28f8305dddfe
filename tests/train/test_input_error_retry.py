"""An input error a worker meets (a bad image under ``on_bad_image=fail``, a shard cut short) fails every attempt the
same way: the worker records it in the run's folder, and an attempt Ray Train restarts (``max_failures``) stops at
once on the record instead of training up to the same file again (an epoch of ImageNet, hours on a small cluster)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ropim.data.decode import BadImageError
from ropim.errors import ConfigError
from ropim.train import driver
from ropim.train.checkpoint import NoRoom
from ropim.train.guard import input_error_met, take_records, write_input_error


@pytest.fixture
def attempts(tmp_path, monkeypatch) -> dict:
    """``driver.worker_main`` on a job whose training raises what ``raised`` holds; counts tasks built and trainings."""
    seen = {"tasks": 0, "trained": 0, "raised": BadImageError("img3.png: cannot decode image (cut short); "
                                                              "set data.on_bad_image=skip to leave such files out")}

    def task(config, worker):
        seen["tasks"] += 1
        return SimpleNamespace(cfg=None)

    def train(task, cfg, worker):
        seen["trained"] += 1
        raise seen["raised"]

    monkeypatch.setattr(driver, "JOBS", {"pretrain": SimpleNamespace(load=lambda what: task)})
    monkeypatch.setattr(driver, "train", train)
    seen["config"] = {"job": "pretrain", "run_dir": str(tmp_path / "runs" / "bad")}
    return seen


def test_a_restarted_attempt_stops_on_the_input_error_the_first_met(attempts):
    for _ in range(3):  # the first attempt and two restarts (max_failures=2)
        with pytest.raises(BadImageError, match=r"^img3\.png: cannot decode image \(cut short\); set data"):
            driver.worker_main(attempts["config"], worker=None)
    assert attempts["trained"] == 1 and attempts["tasks"] == 1  # before: 3 trainings, each up to the same image
    met = input_error_met(attempts["config"]["run_dir"])
    take_records(attempts["config"]["run_dir"])  # what the driver clears as a job ends
    assert type(met) is BadImageError and input_error_met(attempts["config"]["run_dir"]) is None


def test_the_record_keeps_the_error_type_the_driver_acts_on(attempts):
    attempts["raised"] = NoRoom("no space left in the run's storage_path for epoch 3's checkpoint: free space there")
    for _ in range(2):
        with pytest.raises(NoRoom, match="for epoch 3's checkpoint"):  # the driver's NoRoom line names the resume
            driver.worker_main(attempts["config"], worker=None)
    assert attempts["trained"] == 1


def test_other_failures_are_not_recorded(attempts):
    attempts["raised"] = RuntimeError("CUDA error: an illegal memory access was encountered")  # may not repeat
    for _ in range(2):
        with pytest.raises(RuntimeError):
            driver.worker_main(attempts["config"], worker=None)
    assert attempts["trained"] == 2 and input_error_met(attempts["config"]["run_dir"]) is None


def test_a_record_of_an_unknown_type_comes_back_as_a_config_error(tmp_path):
    class Elsewhere(ConfigError):
        pass

    write_input_error(str(tmp_path), Elsewhere("shard train-00003.parquet is cut short"))  # not a ropim module's
    met = input_error_met(str(tmp_path))
    assert type(met) is ConfigError and str(met) == "shard train-00003.parquet is cut short"


def test_the_next_job_of_the_run_starts_without_the_record(workdir):
    """The user fixes the input (or sets on_bad_image=skip) and runs the job again: the record of the last job's
    attempts is history, cleared as the job starts."""
    from support import tiny_pretrain

    from ropim.train.driver import run
    from ropim.train.runtime import run_dir

    cfg = tiny_pretrain(run_name="fixed-input", num_workers=0, epochs=1, max_steps_per_epoch=1)
    write_input_error(run_dir(cfg), BadImageError("img3.png: cannot decode image"))
    result = run(cfg)
    assert result.metrics["epoch"] == 1 and input_error_met(run_dir(cfg)) is None
