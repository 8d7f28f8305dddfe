"""A sweep across nodes whose driver is killed: ``ropim sweep`` (the rho_ablation preset on two rho values, one 1.5-CPU
worker per trial, so one trial fills a 2-CPU node) with its Tune experiment and every trial's checkpoints in S3.
Node b starts busy with another job, so the first trial runs on node a; node b is freed once that trial has written
its first checkpoint, while it still fills node a, so the second runs on node b (freed at the final checkpoint, the
first trial could end and free node a first, and the second then ran on node a: seen once in CI). The driver process
is killed with SIGKILL once Tune's state in S3 shows the first trial finished and the second has started; ``ropim
sweep --resume NAME --storage-path s3://…`` then finishes the sweep without running the finished trial again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
import ray
from mlflow.tracking import MlflowClient
from support import run_cli

pytestmark = pytest.mark.cluster

NAME = "rho-nodes"
RHOS = [0.14, 0.5]
TINY = ["--model.depth", "1", "--global_batch_size", "16", "--max_steps_per_epoch", "3", "--epochs", "2",
        "--workers-per-trial", "1", "--cpus-per-worker", "1.5", "--warmup_epochs", "0", "--log_every", "100",
        "--viz_every", "0", "--max-concurrent", "2"]

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module


@ray.remote(num_cpus=2)
class Hold:
    """Another job's actor that keeps a node's CPUs busy."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def trial_folders(s3_server) -> dict[str, dict[str, set[str]]]:
    """{trial id: {"checkpoints": checkpoint folders, "placement_groups": ids}} in the sweep's Train storage."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for key in s3_server.keys(f"sweeps/{NAME}/train/"):
        parts = key.split("/")
        if len(parts) > 5 and parts[3].startswith("trial_"):
            what = "checkpoints" if parts[4].startswith("checkpoint_") and parts[4].count("_") > 1 else parts[4]
            found[parts[3].removeprefix("trial_")][what].add(parts[5] if what == "placement_groups" else parts[4])
    return found


def tune_statuses(storage: str) -> dict[str, str]:
    """{trial id: status} from the Tune experiment state the driver last saved to S3 ({} before its first save)."""
    from ray.tune import ExperimentAnalysis

    try:
        return {t.trial_id: t.status for t in ExperimentAnalysis(f"{storage}/{NAME}").trials}
    except Exception:  # noqa: BLE001 — not written yet
        return {}


def wait_for(what: str, check, proc, log, timeout: float = 400):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert proc.poll() is None, f"the sweep exited before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(0.5)
    return found


def worker_nodes(placement_groups: set[str]) -> set[str]:
    """Nodes of the Ray Train workers (alive or dead) placed in these placement groups."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", "RayTrainWorker")], detail=True, limit=10_000,
                         raise_on_missing_output=False)
    return {a.node_id for a in actors if a.placement_group_id in placement_groups}


def test_sweep_across_nodes_resumes_after_its_driver_is_killed(ray_cluster, mlflow_server, s3_server, tmp_path,
                                                               record_property):
    storage = s3_server.uri("sweeps")
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server.uri,
           "TUNE_GLOBAL_CHECKPOINT_S": "1"}  # the driver saves Tune's state every second: the kill finds it current
    hold = Hold.options(resources={"node_b": 0.01}).remote()
    assert ray.get(hold.node.remote()) == ray_cluster.node_id("b")
    log = tmp_path / "driver.log"
    cmd = [sys.executable, "-m", "ropim.cli", "sweep", "--preset", "rho_ablation", "--space",
           json.dumps({"rho": {"grid": RHOS}}), *TINY, "--name", NAME, "--storage-path", storage]
    started = time.time()
    with open(log, "wb") as out:  # its own process group: the kill takes the driver and anything it started
        driver = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        first = wait_for("first checkpoint of a trial", lambda: next(
            (t for t, f in trial_folders(s3_server).items() if f["checkpoints"]), None), driver, log)
        ray.kill(hold)  # node b free: the second trial starts there (node a holds the first, an epoch from its end)
        second = wait_for("second trial at work", lambda: next(
            (t for t, f in trial_folders(s3_server).items() if t != first and f["placement_groups"]), None),
            driver, log)
        wait_for("first trial finished in Tune's saved state",
                 lambda: tune_statuses(storage).get(first) == "TERMINATED", driver, log)
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        killed_at = time.time()
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    at_kill = tune_statuses(storage)
    assert at_kill[first] == "TERMINATED" and at_kill[second] != "TERMINATED", at_kill  # killed mid-sweep
    first_objects = s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                                       Prefix=f"sweeps/{NAME}/train/trial_{first}/")["Contents"]

    t0 = time.time()
    resumed = run_cli("sweep", "--resume", NAME, "--storage-path", storage, env={
        "MLFLOW_TRACKING_URI": mlflow_server.uri}, timeout=500)
    resume_s = time.time() - t0
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"[sweep] resuming {storage}/{NAME}: finished trials are kept" in resumed.stdout
    assert tune_statuses(storage) == {first: "TERMINATED", second: "TERMINATED"}

    # the finished trial was not run again: nothing of it in S3 or MLflow changed after the kill
    after = s3_server.client().list_objects_v2(Bucket=s3_server.bucket,
                                               Prefix=f"sweeps/{NAME}/train/trial_{first}/")["Contents"]
    assert {(o["Key"], o["LastModified"]) for o in after} == {(o["Key"], o["LastModified"]) for o in first_objects}
    c = MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)
    parent = c.search_runs([c.get_experiment_by_name("ropim-sweep").experiment_id],
                           filter_string=f"tags.`ropim.sweep` = '{NAME}' and tags.`ropim.kind` = 'sweep'")
    assert len(parent) == 1 and parent[0].info.status == "FINISHED", (parent[0].data.tags, resumed.stdout[-3000:])
    children = {r.data.tags["ropim.trial_id"]: r for r in c.search_runs(
        [parent[0].info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent[0].info.run_id}'")}
    assert set(children) == {first, second}
    assert all(m.timestamp / 1000 < killed_at for m in c.get_metric_history(children[first].info.run_id, "loss"))
    for run in children.values():
        steps = [m.step for m in c.get_metric_history(run.info.run_id, "loss")]
        assert run.info.status == "FINISHED" and sorted(steps) == sorted(set(steps)) and max(steps) == 2
        assert run.data.tags["ropim.checkpoint"].startswith(f"{storage}/{NAME}/train/trial_")
    assert sorted(float(r.data.params["model.rho"]) for r in children.values()) == RHOS
    versions = c.search_model_versions(f"tags.sweep = '{NAME}'")
    assert len(versions) == 1  # the best trial's encoder, registered once

    # trials on different nodes; the Tune experiment and every checkpoint in S3
    folders = trial_folders(s3_server)
    assert worker_nodes(folders[first]["placement_groups"]) == {ray_cluster.node_id("a")}
    assert ray_cluster.node_id("b") in worker_nodes(folders[second]["placement_groups"])
    keys = s3_server.keys(f"sweeps/{NAME}/")
    assert any(k.startswith(f"sweeps/{NAME}/experiment_state-") for k in keys)
    assert f"sweeps/{NAME}/ropim_run.json" in keys
    for trial in (first, second):  # the final one among them (the killed run may have left one it never registered)
        final = children[trial].data.tags["ropim.checkpoint"].rsplit("/", 1)[1]
        assert final in folders[trial]["checkpoints"] and len(folders[trial]["checkpoints"]) >= 2, folders[trial]
    record_property("checkpoints", {t: sorted(folders[t]["checkpoints"]) for t in (first, second)})
    record_property("seconds_to_kill_and_resume", {"kill_after_start": round(killed_at - started, 1),
                                                   "resume": round(resume_s, 1)})
