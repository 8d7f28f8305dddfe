"""``ingest=ray_data`` on a cluster joined by address (RAY_ADDRESS, or a Ray this process is connected to) whose CPUs
the Train workers would all hold: Ray Data would read no row until Ray's 30-minute timeout. Refused in one line once
connected, from the cluster's own resources, before the MLflow run opens and the trainer starts."""

from __future__ import annotations

import pytest
from support import run_cli, tiny_pretrain

from ropim.errors import ConfigError
from ropim.train.driver import run

pytestmark = pytest.mark.cluster


def test_workers_holding_every_cpu_of_a_joined_cluster_are_refused_before_the_run(ray_cluster, tmp_path,
                                                                                   monkeypatch):
    # the cluster: a head without CPUs and 2 worker nodes of 2 CPUs; 2 workers × 2 CPUs hold all 4
    job = run_cli("pretrain", "--preset", "digits_demo", "--ingest", "ray_data", "--num_workers", "2",
                  "--cpus_per_worker", "2", "--run_name", "starved", cwd=tmp_path,
                  env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}, timeout=300)
    lines = job.stderr.strip().splitlines()
    assert job.returncode != 0 and len(lines) == 1, job.stderr[-3000:]
    assert f"hold 4 of the 4 CPUs of the Ray cluster at {ray_cluster.address}" in lines[0]
    assert lines[0].endswith("use --cpus_per_worker 1.5, --num_workers 1 or --ingest torch")
    assert "[pretrain]" not in job.stdout and not (tmp_path / "ray_results" / "starved").exists()  # no run opened

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(ConfigError, match="leaving Ray Data's read and decode tasks 0"):  # joined in this process
        run(tiny_pretrain(run_name="starved-here", ingest="ray_data", num_workers=2, cpus_per_worker=2,
                          storage_path=str(tmp_path / "ray_results")))
    assert not (tmp_path / "ray_results" / "starved-here").exists()
