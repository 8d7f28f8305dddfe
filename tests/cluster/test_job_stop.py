"""``ray job stop`` of a submitted pretraining job on the multi-node cluster: the job reads its data by a path relative
to ``--working-dir`` (Ray's unpacked copy, where the driver runs), its two workers on different nodes; stopped once a
checkpoint is committed, the run ends KILLED with nothing registered, and the job resubmitted with ``--resume``
continues from that checkpoint."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from PIL import Image

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
TINY = ("--preset", "digits_demo", "--model.depth", "1", "--max_steps_per_epoch", "1", "--global_batch_size", "16",
        "--viz_every", "0", "--eval_every", "0", "--num_workers", "2", "--placement_strategy", "STRICT_SPREAD")


def working_dir(root: Path) -> Path:
    """A project folder as a user submits it: the code and a small two-class ImageFolder ``imgs/``."""
    for package in ("ropim", "tune", "jobs"):
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / "imgs" / c).mkdir(parents=True)
        for i in range(24):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / "imgs" / c / f"{i}.png")
    return root


def ray_job(dashboard: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``ray job ARGS`` against the cluster's job API."""
    cmd = [str(Path(sys.executable).with_name("ray")), "job", *args[:1], "--address", f"http://{dashboard}", *args[1:]]
    return subprocess.run(cmd, env={**os.environ, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True,
                          timeout=timeout)


def test_ray_job_stop_ends_the_run_killed_and_resume_continues(ray_cluster, mlflow_server, s3_server, tmp_path):
    dashboard = ray_cluster.cluster.head_node.address_info["webui_url"]
    project = working_dir(tmp_path / "project")
    storage = s3_server.uri("stops")
    env = json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": mlflow_server.uri, "RAY_JOB_STOP_WAIT_TIME_S": "30"}})
    job_id = f"ropim-stop-{secrets.token_hex(3)}"
    submitted = ray_job(dashboard, "submit", "--no-wait", "--submission-id", job_id, "--working-dir", str(project),
                        "--runtime-env-json", env, "--", sys.executable, "jobs/pretrain.py", *TINY,
                        "--data.source", "imgs", "--epochs", "1000", "--storage_path", storage, "--run_name", "stopped")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    deadline = time.time() + 400
    while "stops/stopped/checkpoint_manager_snapshot.json" not in s3_server.keys("stops/stopped/"):  # committed
        status = ray_job(dashboard, "status", job_id).stdout
        assert time.time() < deadline and "FAILED" not in status, ray_job(dashboard, "logs", job_id).stdout[-4000:]
        time.sleep(1)
    stop = ray_job(dashboard, "stop", job_id)  # SIGTERM to the driver
    assert stop.returncode == 0, stop.stdout + stop.stderr
    logs = ray_job(dashboard, "logs", job_id).stdout
    assert "stopped by SIGTERM" in logs and "marked KILLED" in logs, logs[-4000:]
    # the job form of the continue command (what is done below); checkpoints on S3: no note about Ray's folder copy
    assert "ray job submit --working-dir . -- python jobs/pretrain.py --resume stopped --storage_path s3://" in logs
    assert "lies inside Ray's copy" not in logs
    assert "nodes and data.source=" in logs and "working_dir_files" in logs  # the cluster note: a local path

    client = MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)
    exp = client.get_experiment_by_name("ropim-pretrain").experiment_id
    run = client.search_runs([exp], filter_string="attributes.run_name = 'stopped'")[0]
    assert run.info.status == "KILLED"
    assert not client.search_model_versions(f"run_id='{run.info.run_id}'")

    resumed = ray_job(dashboard, "submit", "--working-dir", str(project), "--runtime-env-json", env, "--",
                      sys.executable, "jobs/pretrain.py", "--resume", "stopped", "--storage_path", storage,
                      "--stop_after_epochs", "1", timeout=500)
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0 and "succeeded" in out, out[-4000:]
    assert "resumed from epoch" in out and "stopped after epoch" in out, out[-4000:]
    again = client.search_runs([exp], filter_string="attributes.run_name = 'stopped'")
    assert [r.info.run_id for r in again] == [run.info.run_id]  # the same MLflow run continued
