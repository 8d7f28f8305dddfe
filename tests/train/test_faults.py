"""Faults, in this process or in a job killed hard: a diverging loss stops the run FAILED with nothing registered; a
second job cannot take a run that a live job holds; a job killed with SIGKILL mid-epoch resumes from its last
checkpoint to exactly the uninterrupted step count, learning rates and metric history, each epoch recorded once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import encoder_folder, run_cli, tiny_finetune, tiny_pretrain

from ropim.tracking import store
from ropim.train.finetune import finetune
from ropim.train.guard import Diverged
from ropim.train.pretrain import pretrain

KILLED = dict(num_workers=0, epochs=3, max_steps_per_epoch=4)
# a pretraining job that stops to wait (holding its run) at optimizer step 6, mid epoch 2, until it is killed
PAUSED_JOB = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from support import tiny_pretrain
from ropim.train import pretrain as module

def pausing(config, worker):
    original = module.sketch_generator

    def generator(seed, step, rank, device):
        if step == 6:
            Path(sys.argv[1]).write_text("paused")
            time.sleep(600)
        return original(seed, step, rank, device)

    module.sketch_generator = generator
    module.worker_main(config, worker)

module.pretrain(tiny_pretrain(run_name="killed", num_workers=0, epochs=3, max_steps_per_epoch=4), worker_fn=pausing)
"""


def lr_and_loss(run_id: str) -> tuple[list, list]:
    c = store.client()
    return tuple([(m.step, m.value) for m in sorted(c.get_metric_history(run_id, key), key=lambda m: m.step)]
                 for key in ("lr", "loss"))


def test_diverging_loss_stops_the_run_failed_and_registers_nothing(workdir):
    cfg = tiny_pretrain(run_name="nan", base_lr=1e6, num_workers=0, epochs=2)
    with pytest.raises(Diverged, match=r"step 4 \(epoch 2\): gradient norm (nan|inf), loss .* at lr .*lower base_lr"):
        pretrain(cfg)
    c = store.client()
    run_id = next(r for r in c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id])
                  if r.info.run_name == "nan").info.run_id
    assert c.get_run(run_id).info.status == "FAILED"
    assert not c.search_model_versions(f"run_id='{run_id}'")
    kept = sorted(p.name for p in Path("ray_results/nan/in_process").glob("checkpoint_*"))
    assert kept == ["checkpoint_000001"]  # the last good checkpoint (the warm-up survived epoch 1), nothing after

    enc = str(encoder_folder(workdir / "enc"))
    with pytest.raises(Diverged, match="lower base_lr"):
        finetune(tiny_finetune(enc, num_workers=0, base_lr=1e6, run_name="ft-nan"))
    assert not c.search_model_versions("name='ropim-classifier'")


def test_run_in_use_is_refused_and_sigkilled_job_resumes_exactly(workdir, tmp_path):
    straight = pretrain(tiny_pretrain(run_name="reference", **KILLED))
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

    resumed = pretrain(tiny_pretrain(run_name="killed", **KILLED))  # the same job again: takes over the stale lock
    assert resumed.metrics["step"] == straight.metrics["step"] == 12 and resumed.encoder_uri is not None
    lr, loss = lr_and_loss(resumed.run_id)
    assert lr == lr_and_loss(straight.run_id)[0]  # the schedule continued where the killed job stopped
    assert [s for s, _ in loss] == [1, 2, 3]  # epoch 2, retrained after the kill, is recorded once
    c = store.client()
    assert c.get_run(resumed.run_id).info.status == "FINISHED"
    assert len(c.search_model_versions(f"run_id='{resumed.run_id}'")) == 1
    assert not (workdir / "ray_results" / "killed" / ".lock").exists()  # released at the end


TERMED = ("pretrain", "--preset", "digits_demo", "--num_workers", "0", "--model.depth", "1", "--epochs", "1000",
          "--global_batch_size", "16", "--max_steps_per_epoch", "1", "--viz_every", "0", "--eval_every", "0",
          "--run_name", "termed")


def test_sigterm_ends_the_run_killed_registers_nothing_and_the_same_command_resumes(workdir):
    job = subprocess.Popen([sys.executable, "-m", "ropim.cli", *TERMED], cwd=workdir, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    folder = workdir / "ray_results" / "termed" / "in_process"
    try:
        deadline = time.time() + 300
        while not (folder / "checkpoint_000001").exists():  # a complete checkpoint is renamed into place
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
