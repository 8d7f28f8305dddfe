"""Faults, in this process or in a job killed hard: a diverging loss stops the run FAILED with nothing registered; a
second job cannot take a run that a live job holds; a job killed with SIGKILL mid-epoch resumes from its last
checkpoint to exactly the uninterrupted step count, learning rates and metric history, each epoch recorded once."""

from __future__ import annotations

import dataclasses
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import encoder_folder, run_cli, tiny_finetune, tiny_pretrain, undecodable_shard

from ropim.data.config import DataConfig
from ropim.data.decode import BadImageError
from ropim.errors import ConfigError
from ropim.tracking import store
from ropim.train.driver import run
from ropim.train.guard import Diverged

KILLED = dict(num_workers=0, epochs=3, max_steps_per_epoch=4)
# a pretraining job that stops to wait (holding its run) at optimizer step 6, mid epoch 2, until it is killed
PAUSED_JOB = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from support import tiny_pretrain
from ropim.train.pretrain import task as module
from ropim.train.driver import run, worker_main

def pausing(config, worker):
    original = module.sketch_generator

    def generator(seed, step, rank, device):
        if step == 6:
            Path(sys.argv[1]).write_text("paused")
            time.sleep(600)
        return original(seed, step, rank, device)

    module.sketch_generator = generator
    worker_main(config, worker)

run(tiny_pretrain(run_name="killed", num_workers=0, epochs=3, max_steps_per_epoch=4), worker_fn=pausing)
"""


def lr_and_loss(run_id: str) -> tuple[list, list]:
    c = store.client()
    return tuple([(m.step, m.value) for m in sorted(c.get_metric_history(run_id, key), key=lambda m: m.step)]
                 for key in ("lr", "loss"))


def test_diverging_loss_stops_the_run_failed_and_registers_nothing(workdir):
    # fp32 on every machine: precision auto is bf16 on CPUs with native bf16, where the loss diverges a step earlier,
    # in epoch 1 (the step and the kept checkpoint asserted below are fp32's)
    cfg = tiny_pretrain(run_name="nan", base_lr=1e6, num_workers=0, epochs=2, precision="fp32")
    with pytest.raises(Diverged, match=r"step 4 \(epoch 2\): gradient norm (nan|inf), loss .* at lr .*lower base_lr"):
        run(cfg)
    c = store.client()
    run_id = next(r for r in c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id])
                  if r.info.run_name == "nan").info.run_id
    assert c.get_run(run_id).info.status == "FAILED"
    assert not c.search_model_versions(f"run_id='{run_id}'")
    kept = sorted(p.name for p in Path("ray_results/nan/in_process").glob("checkpoint_*"))
    assert kept == ["checkpoint_000001"]  # the last good checkpoint (the warm-up survived epoch 1), nothing after

    enc = str(encoder_folder(workdir / "enc"))
    with pytest.raises(Diverged, match="lower base_lr"):
        run(tiny_finetune(enc, num_workers=0, base_lr=1e6, run_name="ft-nan"))
    assert not c.search_model_versions("name='ropim-classifier'")


@pytest.mark.faults
def test_run_in_use_is_refused_and_sigkilled_job_resumes_exactly(workdir, tmp_path):
    straight = run(tiny_pretrain(run_name="reference", **KILLED))
    marker = tmp_path / "paused"
    job = subprocess.Popen([sys.executable, "-c", PAUSED_JOB, str(marker), str(Path(__file__).parents[1])],
                           cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not marker.exists():
            assert job.poll() is None and time.time() < deadline, job.stderr.read()[-2000:] if job.poll() else "slow"
            time.sleep(0.2)
        second = run_cli("pretrain", "--preset", "digits_demo", "--run_name", "killed", cwd=workdir)
        assert second.returncode != 0 and "run_name='killed' is in use by another job" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
    finally:
        job.send_signal(signal.SIGKILL)  # kill -9, mid epoch 2: epoch 1's checkpoint is the latest
        job.wait()
    assert sorted(p.name for p in Path("ray_results/killed/in_process").glob("checkpoint_*")) == ["checkpoint_000001"]

    resumed = run(tiny_pretrain(run_name="killed", **KILLED))  # the same job again: takes over the stale lock
    assert resumed.metrics["step"] == straight.metrics["step"] == 12 and resumed.model_uri is not None
    lr, loss = lr_and_loss(resumed.run_id)
    assert lr == lr_and_loss(straight.run_id)[0]  # the schedule continued where the killed job stopped
    assert [s for s, _ in loss] == [1, 2, 3]  # epoch 2, retrained after the kill, is recorded once
    c = store.client()
    assert c.get_run(resumed.run_id).info.status == "FINISHED"
    assert len(c.search_model_versions(f"run_id='{resumed.run_id}'")) == 1
    assert not (workdir / "ray_results" / "killed" / ".lock").exists()  # released at the end


TERMED = ("pretrain", "--preset", "digits_demo", "--num_workers", "0", "--model.depth", "1", "--epochs", "100000",
          "--global_batch_size", "16", "--max_steps_per_epoch", "1", "--viz_every", "0", "--eval_every", "0",
          "--run_name", "termed")


@pytest.mark.faults
def test_sigterm_ends_the_run_killed_registers_nothing_and_the_same_command_resumes(workdir):
    job = subprocess.Popen([sys.executable, "-m", "ropim.cli", *TERMED], cwd=workdir, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    folder = workdir / "ray_results" / "termed" / "in_process"
    try:
        deadline = time.time() + 300
        # a complete checkpoint is renamed into place; only the last two are kept, so wait for any of them
        while not any(folder.glob("checkpoint_*")):
            assert job.poll() is None and time.time() < deadline, job.stderr.read()[-2000:] if job.poll() else "slow"
            time.sleep(0.2)
        job.send_signal(signal.SIGTERM)  # what `ray job stop`, Kubernetes and batch schedulers send
        out, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 128 + signal.SIGTERM, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "termed stopped by SIGTERM" in last and "marked KILLED" in last, err[-2000:]
    assert "continue with: ropim pretrain --resume termed" in last
    c = store.client()
    run = next(r for r in c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id])
               if r.info.run_name == "termed")
    assert run.info.status == "KILLED"
    assert not c.search_model_versions(f"run_id='{run.info.run_id}'")
    kept = sorted(p.name for p in folder.glob("checkpoint_*"))
    assert kept and not (workdir / "ray_results" / "termed" / ".lock").exists()
    resumed = run_cli(*TERMED, "--stop_after_epochs", "1", cwd=workdir)  # the same run, one more epoch
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from epoch {int(kept[-1].split('_')[1])}" in resumed.stdout + resumed.stderr
    assert c.get_run(run.info.run_id).info.status == "KILLED"  # stopped on purpose again, same MLflow run


def test_a_checkpoint_that_cannot_be_loaded_falls_back_to_the_previous_one(workdir, caplog):
    cfg = tiny_pretrain(run_name="torn", num_workers=0, epochs=3)
    run(dataclasses.replace(cfg, stop_after_epochs=2))
    folder = workdir / "ray_results" / "torn" / "in_process"
    weights = folder / "checkpoint_000002" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # the disk lost its tail
    with caplog.at_level("INFO", logger="ropim.train"):
        result = run(cfg)
    assert result.metrics["epoch"] == 3 and result.model_uri is not None
    said = [r.getMessage() for r in caplog.records if "resumed from" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("[pretrain] resumed from epoch 1, step 3 (")
    assert "checkpoint_000002 (" in said[0] and "the previous complete checkpoint is used" in said[0]

    gone = dataclasses.replace(cfg, run_name="gone", stop_after_epochs=1)
    run(gone)
    (workdir / "ray_results" / "gone" / "in_process" / "checkpoint_000001" / "train_state.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="no checkpoint of this run can be loaded: .*gone/in_process/checkpoint_0+1 "):
        run(gone)  # none left that loads: one clear error, nothing trained


@pytest.mark.faults  # a bad image stops the Ray workers
def test_an_undecodable_image_under_fail_is_one_line_from_the_ray_workers(workdir, ray_session):
    undecodable_shard(workdir / "bytes")
    cfg = tiny_pretrain(run_name="undecodable", num_workers=2, epochs=1, max_steps_per_epoch=None, max_failures=1,
                        global_batch_size=8, data=DataConfig(source="bytes", on_bad_image="fail", val_fraction=0.01))
    with pytest.raises(BadImageError) as raised:
        run(cfg)
    message = str(raised.value)
    named = re.match(r"img(\d+)\.png: cannot decode image", message)
    assert "\n" not in message and named and int(named[1]) % 4 == 0, message
    assert "data.on_bad_image=skip" in message
    c = store.client()
    failed = next(r for r in c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id])
                  if r.info.run_name == "undecodable")
    assert failed.info.status == "FAILED" and not c.search_model_versions(f"run_id='{failed.info.run_id}'")
    assert not list(workdir.rglob("input_error.json"))  # the restarted attempt stopped on it; the driver cleared it


@pytest.mark.faults  # a bad image stops the Ray workers of a job that joins the session
@pytest.mark.parametrize("ingest", ["torch", "ray_data"])
def test_the_terminal_shows_the_bad_image_once_in_one_line_without_a_traceback(workdir, ray_session, ingest):
    # before: each worker's traceback (70 lines, then the restarted attempt's) came before the job's last line; with
    # ingest=ray_data, Ray Data's records of its failed decode task too, and the job ended in Ray's WorkerGroupError
    # (its advice appended to the image's line hid the image from the driver), after a restart trained again
    undecodable_shard(workdir / f"cut-{ingest}")
    job = run_cli("pretrain", "--preset", "digits_demo", "--data.source", f"cut-{ingest}", "--data.on_bad_image",
                  "fail", "--data.val_fraction", "0.01", "--model.depth", "1", "--global_batch_size", "8",
                  "--epochs", "1", "--num_workers", "2", "--cpus_per_worker", "0.5", "--ingest", ingest,
                  "--max_failures", "1", "--viz_every", "0", "--run_name", f"terminal-{ingest}",
                  cwd=workdir, env={"RAY_ADDRESS": ray_session})
    shown = job.stdout + job.stderr
    assert job.returncode == 1 and "Traceback" not in shown and "Error in training function" not in shown, shown
    assert re.fullmatch(r"ropim pretrain: img\d+\.png: cannot decode image \([^)]*\); remove or replace the file, "
                        r"or set data\.on_bad_image=skip to skip such files", shown.strip().splitlines()[-1]), shown
    assert len(shown.strip().splitlines()) <= 6, shown  # the run's line, precision, Ray Data's one failed line
