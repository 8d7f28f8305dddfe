"""A node lost mid-epoch: a 2-worker pretraining spread over two worker nodes (one worker each) loses the node of
one of its workers while both wait at an optimizer step in the middle of epoch 2. Ray Train restarts the worker
group on the capacity left (elastic ``min_workers=1`` with ``placement_strategy=SPREAD``: both workers on the
surviving node) from the latest checkpoint in S3; the run ends with the uninterrupted step count, each epoch once
in MLflow, one registered encoder, and only loadable checkpoints. Then the same for the node that ran the Ray Data
pipeline's tasks (``ingest=ray_data``), with a replacement node joining first."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import ray
from safetensors.torch import load_file
from support import tiny_pretrain

from ropim.data.config import DataConfig

pytestmark = pytest.mark.cluster

EPOCHS, STEPS = 3, 4  # optimizer steps per epoch (max_steps_per_epoch)
PAUSE_AT = 6  # the first job's workers wait before optimizer step 7 (0-based 6): mid epoch 2, epoch 1 checkpointed
CHECKPOINT_EVERY = 1

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module


def watched(folder: str, config: dict, worker) -> None:
    """A pretraining worker that notes every optimizer step (time, pid, rank, node, step) in ``folder``/steps.txt
    and, until ``folder``/removed exists, waits before step ``PAUSE_AT`` (having noted its node in paused-<rank>)."""
    from ropim.train.driver import worker_main
    from ropim.train.pretrain import task as module

    node = ray.get_runtime_context().get_node_id()
    original = module.sketch_generator

    def generator(seed, step, rank, device):
        with open(f"{folder}/steps.txt", "a") as f:
            f.write(f"{time.time()} {os.getpid()} {rank} {node} {step}\n")
        if step == PAUSE_AT and not os.path.exists(f"{folder}/removed"):
            Path(f"{folder}/paused-{rank}").write_text(node)
            while not os.path.exists(f"{folder}/removed"):
                time.sleep(0.1)
        return original(seed, step, rank, device)

    module.sketch_generator = generator
    worker_main(config, worker)


@dataclasses.dataclass
class Loss:
    """What happened around the node's removal."""

    nodes: dict[int, str]  # rank -> node id, first worker group
    removed: str  # node id
    removed_at: float
    steps: list[tuple[float, int, int, str, int]]  # (time, pid, rank, node, step) of every optimizer step
    result: object = None

    @property
    def restarted(self) -> list[tuple[float, int, int, str, int]]:
        """Steps of the restarted worker group (processes not seen before the removal)."""
        before = {pid for t, pid, *_ in self.steps if t < self.removed_at}
        return [s for s in self.steps if s[1] not in before]

    @property
    def recovery_s(self) -> float:
        """Seconds from the removal to the restarted group's first optimizer step."""
        return min(s[0] for s in self.restarted) - self.removed_at

    @property
    def steps_lost(self) -> int:
        """Steps trained before the removal that the restarted group trained again."""
        return PAUSE_AT - min(s[4] for s in self.restarted)


@pytest.fixture(scope="module")
def tracking(mlflow_server):
    patch = pytest.MonkeyPatch()
    patch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    yield mlflow_server.uri
    patch.undo()


@pytest.fixture(scope="module")
def digits(s3_server) -> str:
    from ropim.data.convert import convert

    uri = s3_server.uri("node-loss-digits")
    convert(DataConfig(source="digits"), uri, progress=False)
    return uri


def data_task_nodes() -> Counter:
    """Nodes that ran this job's Ray Data read/decode tasks, with how many each."""
    from ray.util.state import list_tasks

    job = ray.get_runtime_context().get_job_id()
    tasks = list_tasks(filters=[("job_id", "=", job)], limit=10_000, raise_on_missing_output=False)
    return Counter(t.node_id for t in tasks if t.node_id and any(k in (t.name or "") for k in
                                                                    ("ReadParquet", "MapBatches", "decode_batch")))


def lose_a_node(cfg, ray_cluster, folder: Path, pick) -> Loss:
    """Train ``cfg`` in a thread; when both workers wait at ``PAUSE_AT``, remove the node ``pick(nodes)`` names
    (from the main thread: Ray's node handling needs it), let the workers go on, wait for the job to end."""
    from ropim.train.driver import run

    out: dict = {}

    def job():
        try:
            out["result"] = run(cfg, worker_fn=functools.partial(watched, str(folder)))
        except BaseException as err:  # noqa: BLE001 — reported by the test
            out["error"] = err

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while len(list(folder.glob("paused-*"))) < 2:
        assert thread.is_alive() and time.monotonic() < deadline, out.get("error", "workers never reached the pause")
        time.sleep(0.2)
    nodes = {int(p.name.split("-")[1]): p.read_text() for p in folder.glob("paused-*")}
    removed = pick(nodes)
    name = next(n for n in ray_cluster.nodes if ray_cluster.node_id(n) == removed)
    ray_cluster.remove(name)
    removed_at = time.time()
    (folder / "removed").write_text(str(removed_at))
    thread.join(timeout=400)
    assert not thread.is_alive(), "the run did not finish after the node was lost"
    if "error" in out:
        raise out["error"]
    steps = [(float(t), int(pid), int(rank), node, int(step)) for t, pid, rank, node, step in
             (line.split() for line in (folder / "steps.txt").read_text().splitlines())]
    return Loss(nodes, removed, removed_at, steps, out["result"])


def check_run(loss: Loss, cfg, name: str, mlflow_server, s3_server, ray_cluster, tmp: Path) -> list[str]:
    """The run finished as if uninterrupted; return its checkpoints in the bucket (all loadable)."""
    from mlflow.tracking import MlflowClient

    assert loss.nodes[0] != loss.nodes[1]  # one worker per node
    restarted_nodes = {s[3] for s in loss.restarted}
    assert loss.removed not in restarted_nodes and len({s[2] for s in loss.restarted}) == 2  # 2 workers again
    assert restarted_nodes <= {ray_cluster.node_id(n) for n in ray_cluster.nodes}
    assert 0 <= loss.steps_lost <= CHECKPOINT_EVERY * STEPS
    assert loss.result.metrics["step"] == EPOCHS * STEPS and loss.result.metrics["epoch"] == EPOCHS
    assert sorted({s[4] for s in loss.steps if s[2] == 0}) == list(range(EPOCHS * STEPS))  # no step skipped

    c = MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)
    run = c.get_run(loss.result.run_id)
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in c.get_metric_history(run.info.run_id, "loss")) == [1, 2, 3]  # each epoch once
    versions = c.search_model_versions(f"run_id='{run.info.run_id}'")
    assert len(versions) == 1 and loss.result.model_uri.endswith(f"/{versions[0].version}")

    keys = [k for k in s3_server.keys(f"runs/{name}/") if not k.endswith("/")]
    checkpoints = sorted({k.split("/")[2] for k in keys if k.count("/") > 2 and "checkpoint_" in k.split("/")[2]})
    assert len(checkpoints) == cfg.keep_checkpoints  # the last two kept
    fs = s3_server.filesystem()
    for folder in checkpoints:  # whole and loadable, the latest one the final epoch
        files = {k.split("/")[3] for k in keys if k.split("/")[2] == folder}
        assert files == {"model.safetensors", "train_state.pt", "config.json", "metrics.json"}, files
        with fs.open_input_file(f"{s3_server.bucket}/runs/{name}/{folder}/model.safetensors") as f:
            (tmp / f"{folder}.safetensors").write_bytes(f.read())
        assert load_file(str(tmp / f"{folder}.safetensors"))
    return checkpoints


def test_losing_a_workers_node_mid_epoch_restarts_on_the_rest_from_the_s3_checkpoint(
        ray_cluster, tracking, digits, mlflow_server, s3_server, tmp_path, record_property):
    name = "node-loss-torch"
    cfg = tiny_pretrain(run_name=name, epochs=EPOCHS, max_steps_per_epoch=STEPS, num_workers=2,
                        placement_strategy="SPREAD", min_workers=1, checkpoint_every=CHECKPOINT_EVERY,
                        storage_path=s3_server.uri("runs"), data=DataConfig(source=digits))
    loss = lose_a_node(cfg, ray_cluster, tmp_path, pick=lambda nodes: nodes[0])  # rank 0's node: it checkpoints
    checkpoints = check_run(loss, cfg, name, mlflow_server, s3_server, ray_cluster, tmp_path)
    assert {s[3] for s in loss.restarted} == {loss.nodes[1]}  # both workers on the node left
    record_property("recovery_s", round(loss.recovery_s, 1))
    record_property("steps_lost", loss.steps_lost)
    record_property("checkpoints", checkpoints)


def test_losing_the_ray_data_node_mid_epoch(ray_cluster, tracking, digits, mlflow_server, s3_server, tmp_path,
                                            record_property):
    for lost in {"a", "b"} - set(ray_cluster.nodes):  # a replacement for the node the test before removed
        ray_cluster.add(lost)
    ray_cluster.cluster.wait_for_nodes()
    name = "node-loss-ray-data"
    cfg = tiny_pretrain(run_name=name, epochs=EPOCHS, max_steps_per_epoch=STEPS, num_workers=2,
                        cpus_per_worker=0.5, ingest="ray_data", placement_strategy="SPREAD", min_workers=1,
                        checkpoint_every=CHECKPOINT_EVERY, storage_path=s3_server.uri("runs"),
                        data=DataConfig(source=digits))
    ran_data: Counter = Counter()

    def data_node(nodes: dict[int, str]) -> str:
        ran_data.update(data_task_nodes())
        return ran_data.most_common(1)[0][0]

    loss = lose_a_node(cfg, ray_cluster, tmp_path, pick=data_node)
    assert ran_data[loss.removed] > 0 and loss.removed in loss.nodes.values()
    checkpoints = check_run(loss, cfg, name, mlflow_server, s3_server, ray_cluster, tmp_path)
    record_property("data_tasks_by_node", dict(ran_data))
    record_property("recovery_s", round(loss.recovery_s, 1))
    record_property("steps_lost", loss.steps_lost)
    record_property("checkpoints", checkpoints)
