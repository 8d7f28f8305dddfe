"""The cluster fixtures do what later tests rely on: S3 through pyarrow, boto3 and Ray Data from worker nodes; tasks
pinned per node; a removed node's work unschedulable until a replacement joins; MLflow artifacts landing in S3."""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

pytestmark = pytest.mark.cluster

TABLE = pa.table({"i": list(range(64)), "x": [float(i) / 2 for i in range(64)]})


def test_pyarrow_from_uri_writes_and_reads_parquet_on_the_server(s3_server):
    filesystem, path = fs.FileSystem.from_uri(s3_server.uri("pyarrow", "t.parquet"))  # endpoint from the env only
    pq.write_table(TABLE, path, filesystem=filesystem)
    assert pq.read_table(path, filesystem=filesystem).equals(TABLE)
    assert s3_server.keys("pyarrow/") == ["pyarrow/t.parquet"]  # on the server, seen by another client
    assert pq.read_table(f"{s3_server.bucket}/pyarrow/t.parquet", filesystem=s3_server.filesystem()).equals(TABLE)


def test_cluster_has_a_cpu_less_head_and_two_labelled_worker_nodes(ray_cluster):
    import ray

    alive = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
    assert len(alive) == 3
    assert ray.get_runtime_context().get_node_id() == ray_cluster.cluster.head_node.node_id  # driver on the head
    assert alive[ray_cluster.cluster.head_node.node_id]["Resources"].get("CPU", 0) == 0
    for name in ("a", "b"):
        node = alive[ray_cluster.node_id(name)]
        assert node["Resources"]["CPU"] == 2 and node["Resources"][f"node_{name}"] == 1
        assert node["Labels"]["ropim-node"] == name


def remote_where() -> Any:
    """A 0.1-CPU task returning (node id, AWS_ENDPOINT_URL) of the worker that runs it. Defined in a function so
    that Ray ships it by value: worker processes cannot import this test module."""
    import ray

    @ray.remote(num_cpus=0.1)
    def where() -> tuple[str, str | None]:
        return ray.get_runtime_context().get_node_id(), os.environ.get("AWS_ENDPOINT_URL")

    return where


def test_tasks_pinned_by_resource_or_label_run_on_their_node_with_the_s3_env(ray_cluster, s3_server):
    import ray

    where = remote_where()
    by_resource = ray.get([where.options(resources={f"node_{n}": 0.01}).remote() for n in ("a", "b")])
    by_label = ray.get([where.options(label_selector={"ropim-node": n}).remote() for n in ("a", "b")])
    expected = [(ray_cluster.node_id("a"), s3_server.endpoint), (ray_cluster.node_id("b"), s3_server.endpoint)]
    assert by_resource == by_label == expected
    assert expected[0][0] != expected[1][0]


def test_worker_nodes_write_to_s3_and_ray_data_reads_it_back_on_the_workers(ray_cluster, s3_server):
    import ray

    @ray.remote(num_cpus=0.1)
    def write(uri: str, start: int) -> str:
        filesystem, path = fs.FileSystem.from_uri(uri)  # resolved in the worker, from the node's environment
        pq.write_table(TABLE.slice(start, 32), path, filesystem=filesystem)
        return ray.get_runtime_context().get_node_id()

    wrote = ray.get([write.options(resources={f"node_{n}": 0.01}).remote(s3_server.uri("data", f"{n}.parquet"), s)
                     for n, s in (("a", 0), ("b", 32))])
    assert wrote == [ray_cluster.node_id("a"), ray_cluster.node_id("b")]

    def tag(batch: pa.Table) -> pa.Table:
        node = ray.get_runtime_context().get_node_id()
        return batch.append_column("node", pa.array([node] * len(batch)))

    ds = ray.data.read_parquet(s3_server.uri("data")).map_batches(tag, batch_format="pyarrow")
    rows = ds.take_all()
    assert sorted(r["i"] for r in rows) == list(range(64))
    assert {r["node"] for r in rows} <= {ray_cluster.node_id("a"), ray_cluster.node_id("b")}  # not the head


def test_the_secret_key_is_written_nowhere_in_the_clusters_files(ray_cluster, s3_server):
    # The nodes got the credentials as process environment, not as a runtime_env: Ray records a runtime_env's
    # env_vars in runtime_env_agent.log (and Tune copies AWS_* from the driver's environment into one).
    import ray

    @ray.remote(num_cpus=0.1)
    def say(marker: str) -> None:
        print(marker, flush=True)

    marker = f"marker-{os.getpid()}-{id(say)}"
    ray.get(say.options(resources={"node_b": 0.01}).remote(marker))
    assert any(p.name.startswith("worker-") for p in ray_cluster.files_containing(marker))  # the scan sees logs
    assert ray_cluster.files_containing(s3_server.secret) == []


def test_mlflow_server_puts_logged_artifacts_in_the_bucket(mlflow_server, s3_server, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    run = client.create_run(client.create_experiment("fixtures"))
    (tmp_path / "hello.txt").write_text("hello")
    client.log_artifact(run.info.run_id, str(tmp_path / "hello.txt"), artifact_path="sub")
    client.set_terminated(run.info.run_id)

    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # proxied: the client never talks to S3
    keys = s3_server.keys("mlartifacts/")
    assert keys == [f"mlartifacts/{run.info.experiment_id}/{run.info.run_id}/artifacts/sub/hello.txt"]
    body = s3_server.client().get_object(Bucket=s3_server.bucket, Key=keys[0])["Body"].read()
    assert body == b"hello"
    assert s3_server.secret not in mlflow_server.log.read_text()


def test_removed_node_work_waits_for_a_replacement_while_the_other_node_runs(ray_cluster):
    """Last in the module: it removes node b."""
    import ray

    where = remote_where()
    old_b = ray_cluster.node_id("b")
    ray_cluster.remove("b")
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert old_b not in alive and ray_cluster.node_id("a") in alive
    assert "node_b" not in ray.cluster_resources()

    on_b = where.options(resources={"node_b": 0.01}).remote()
    assert ray.get(where.options(resources={"node_a": 0.01}).remote())[0] == ray_cluster.node_id("a")
    ready, _ = ray.wait([on_b], timeout=3)
    assert not ready  # infeasible while no node offers node_b

    new_b = ray_cluster.add("b")
    assert new_b != old_b
    assert ray.get(on_b, timeout=60)[0] == new_b  # the waiting task runs on the replacement
