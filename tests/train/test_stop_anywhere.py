"""A stop signal at any moment of a job — interpreter start, pre-flight, Ray's start, a step, a checkpoint, the
registration — ends it in one line, leaves no MLflow run RUNNING or FAILED, no lock held, no version half
registered, and the same command then runs to the end."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from support import run_cli

from ropim.tracking import store

JOB = ("pretrain", "--preset", "digits_demo", "--num_workers", "1", "--model.depth", "1", "--epochs", "2",
       "--global_batch_size", "16", "--max_steps_per_epoch", "2", "--viz_every", "0", "--eval_every", "0")
MOMENTS = 6  # one in each sixth of an undisturbed run, at a seeded random place in it
SEED = int(os.environ.get("ROPIM_STOPS_SEED", "0"))  # other moments: ROPIM_STOPS_SEED=N make test-stops
ENDED = ("stopped by SIG", "while no run was open; nothing recorded")
WORKER_LINES = ("[pretrain] epoch", "[pretrain] precision")  # what the Ray worker of JOB logs (ropim.train.loop)


def launch(name: str, cwd) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ropim.cli", *JOB, "--run_name", name], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def runs_named(name: str) -> list:
    c = store.client()
    exp = c.get_experiment_by_name("ropim-pretrain")
    return [] if exp is None else [r for r in c.search_runs([exp.experiment_id]) if r.info.run_name == name]


@pytest.mark.stops
def test_a_stop_signal_at_any_moment_ends_the_job_cleanly(workdir):
    start = time.monotonic()
    whole = launch("whole", workdir)
    out, err = whole.communicate(timeout=300)
    took = time.monotonic() - start
    assert whole.returncode == 0, err[-2000:]
    rng = random.Random(SEED)
    for i in range(MOMENTS):
        at = took * (i + rng.random()) / MOMENTS
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        name = f"stop{i}"
        job = launch(name, workdir)
        time.sleep(at)
        if job.poll() is None:
            job.send_signal(sig)
        try:
            out, err = job.communicate(timeout=90)  # a lost stop would leave it training or hanging
        finally:
            job.kill()
        case = f"{sig.name} at {at:.1f} s of {took:.1f} s (seed {SEED}): rc {job.returncode}\n{err[-2500:]}"
        # the driver's own lines: Ray forwards a worker's lines (its precision line as it starts, its progress lines)
        # when they arrive, maybe after the driver's last
        lines = [line for line in err.strip().splitlines() if not line.startswith(WORKER_LINES)]
        runs = runs_named(name)
        print(f"{sig.name} at {at:.1f}/{took:.1f} s: rc {job.returncode}, runs {[r.info.status for r in runs]}, "
              f"{lines[-1] if lines else ''}")
        assert "Traceback" not in err and all(r.info.status in ("KILLED", "FINISHED") for r in runs), case
        assert not (workdir / "ray_results" / name / ".lock").exists(), case
        if job.returncode == 0:  # it had finished before the signal could matter
            assert [r.info.status for r in runs] == ["FINISHED"], case
            continue
        assert job.returncode == 128 + sig, case
        assert lines and any(e in lines[-1] for e in ENDED) and sig.name in lines[-1], case
        c = store.client()
        for r in runs:
            versions = c.search_model_versions(f"run_id='{r.info.run_id}'")
            if r.info.status == "KILLED":
                assert not versions and "nothing registered" in lines[-1], case
            else:  # stopped once its version was registered and recorded: complete, tagged
                assert [v.tags.get("kind") for v in versions] == ["encoder"], case
                assert r.data.tags.get("ropim.encoder_uri"), case
        if not runs:
            assert "nothing recorded" in lines[-1], case
            continue
        again = run_cli(*JOB, "--run_name", name, cwd=workdir)  # the same command continues and finishes
        assert again.returncode == 0, case + again.stderr[-2000:]
        assert [r.info.status for r in runs_named(name)] == ["FINISHED"], case
