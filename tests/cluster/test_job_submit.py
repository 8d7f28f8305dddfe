"""``ray job submit`` of a pretraining job to the multi-node cluster: the job's runtime env gives only the MLflow
server's URI (credentials are the nodes' own); its two Ray Train workers run on different nodes (STRICT_SPREAD), its
run folder is in S3, and it is tracked by an MLflow server whose runs and registry are in PostgreSQL (a server this
module starts; sqlite where PostgreSQL is not installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]


def train_workers() -> dict[str, str]:
    """{actor id: node id} of every Ray Train worker the cluster has seen (alive or dead)."""
    from ray.util.state import list_actors

    return {a.actor_id: a.node_id for a in list_actors(filters=[("class_name", "=", "RayTrainWorker")],
                                                       detail=True, limit=10_000, raise_on_missing_output=False)}


def test_ray_job_submit_pretrains_on_two_nodes_into_a_database_backed_mlflow(
        ray_cluster, mlflow_db_server, database, s3_server, record_property):
    record_property("mlflow_backend", database.kind + (f" ({database.why})" if database.why else ""))
    dashboard = ray_cluster.cluster.head_node.address_info["webui_url"]
    before = train_workers()
    cmd = [
        str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", f"http://{dashboard}",
        "--working-dir", str(ROOT),
        "--runtime-env-json", json.dumps({"env_vars": {"MLFLOW_TRACKING_URI": mlflow_db_server.uri}}),
        "--", sys.executable, "jobs/pretrain.py", "--preset", "digits_demo", "--model.depth", "1", "--epochs", "2",
        "--max_steps_per_epoch", "3", "--global_batch_size", "16", "--viz_every", "0", "--num_workers", "2",
        "--placement_strategy", "STRICT_SPREAD", "--storage_path", s3_server.uri("jobs"), "--run_name", "submitted",
    ]
    proc = subprocess.run(cmd, env={**os.environ, "RAY_AUTH_MODE": "token"}, capture_output=True,
                          text=True, timeout=500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "succeeded" in out, out[-4000:]
    assert s3_server.secret not in out

    client = MlflowClient(tracking_uri=mlflow_db_server.uri, registry_uri=mlflow_db_server.uri)
    runs = client.search_runs([client.get_experiment_by_name("ropim-pretrain").experiment_id],
                              filter_string="attributes.run_name = 'submitted'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")) == [1, 2]
    name, version = runs[0].data.tags["ropim.encoder_uri"].removeprefix("models:/").split("/")
    assert client.get_model_version(name, version).run_id == runs[0].info.run_id
    new_workers = {a: n for a, n in train_workers().items() if a not in before}
    assert len(new_workers) == 2 and set(new_workers.values()) == {ray_cluster.node_id("a"), ray_cluster.node_id("b")}
    assert any(k.startswith("jobs/submitted/checkpoint_") for k in s3_server.keys("jobs/submitted/"))
    if database.kind == "postgresql":  # the run is in PostgreSQL's tables
        import psycopg

        with psycopg.connect(database.uri.replace("postgresql+psycopg", "postgresql")) as conn:
            assert conn.execute("select name, status from runs where run_uuid = %s",
                                (runs[0].info.run_id,)).fetchall() == [("submitted", "FINISHED")]
    assert ray_cluster.files_containing(s3_server.secret) == []
