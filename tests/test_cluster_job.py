"""`make cluster-up`'s Ray head + MLflow server: a `ray job submit` pretraining job lands in the MLflow server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[1]
PORTS = {  # away from the defaults so a developer's own `make cluster-up` keeps running
    "RAY_PORT": "6391", "DASH_PORT": "8277", "MLFLOW_PORT": "5011", "RAY_CLIENT_PORT": "10021",
    "RAY_DASH_AGENT_PORT": "52385", "RAY_AUTOSCALER_METRIC_PORT": "44257", "RAY_DASHBOARD_METRIC_PORT": "44267",
    "RAY_MIN_WORKER_PORT": "30002", "RAY_MAX_WORKER_PORT": "31999",
}


@pytest.fixture(scope="module")
def cluster():
    # a short path: Ray's unix sockets live under the temp dir and must stay under ~107 characters
    cluster_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    env = {**os.environ, **PORTS, "CLUSTER_DIR": str(cluster_dir), "VENV": str(Path(sys.executable).parents[1])}
    script = str(ROOT / "scripts" / "cluster.sh")
    try:
        up = subprocess.run([script, "up"], env=env, timeout=240, capture_output=True, text=True)
        if up.returncode != 0:
            pytest.fail(f"cluster.sh up failed ({up.returncode}):\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
        yield env
    finally:
        subprocess.run([script, "down"], env=env, timeout=120, capture_output=True)
        shutil.rmtree(cluster_dir, ignore_errors=True)


def test_ray_job_submit_pretrain_is_tracked_by_mlflow_server(cluster):
    tracking = f"http://127.0.0.1:{PORTS['MLFLOW_PORT']}"
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray_bin), "job", "submit", "--address", f"http://127.0.0.1:{PORTS['DASH_PORT']}",
        "--working-dir", str(ROOT), "--runtime-env-json", json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": tracking}}),
        "--", sys.executable, "jobs/pretrain.py", "--preset", "digits_demo", "--model.depth", "1", "--epochs", "1",
        "--max_steps_per_epoch", "2", "--global_batch_size", "16", "--num_workers", "0",
        "--run_name", "submitted",
    ]
    proc = subprocess.run(cmd, env={**cluster, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in proc.stdout + proc.stderr

    client = MlflowClient(tracking_uri=tracking, registry_uri=tracking)
    exp = client.get_experiment_by_name("ropim-pretrain")
    runs = client.search_runs([exp.experiment_id], filter_string="attributes.run_name = 'submitted'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    encoder_uri = runs[0].data.tags["ropim.encoder_uri"]
    name, version = encoder_uri.removeprefix("models:/").split("/")
    assert client.get_model_version(name, version).run_id == runs[0].info.run_id
