"""S3 end to end on a multi-node cluster, through the ``ropim`` command in fresh processes: digits converted to Parquet
shards in the bucket; pretraining that reads them and keeps its run (checkpoints, run record, lock) in the bucket,
through Ray Data and through the torch ingest; a run stopped after one epoch and continued by the same command; a
fine-tune of the registered encoder with its checkpoints in the bucket, in this process. MLflow is a server whose
artifacts live in the bucket. Credentials come only from the AWS environment variables, and show up nowhere: not
in MLflow params, tags or model-version tags, not in the commands' output, not in the Ray cluster's files."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient
from support import run_cli

pytestmark = pytest.mark.cluster

TINY = ("--preset", "digits_demo", "--model.depth", "1", "--epochs", "2", "--global_batch_size", "16",
        "--max_steps_per_epoch", "3", "--warmup_epochs", "1", "--viz_every", "0", "--log_every", "100")


@pytest.fixture(scope="module")
def ropim(ray_cluster, mlflow_server, s3_server, tmp_path_factory):
    """``ropim ARGS`` in a fresh process, in an empty folder, on the cluster, tracked by the MLflow server; every
    output is kept to be searched for credentials."""
    cwd = tmp_path_factory.mktemp("s3-cli")
    outputs: list[str] = []

    def run(*args: str, ok: bool = True):
        proc = run_cli(*args, cwd=cwd, env={"MLFLOW_TRACKING_URI": mlflow_server.uri}, timeout=400)
        outputs.append(proc.stdout + proc.stderr)
        if ok:
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    run.cwd, run.outputs = cwd, outputs
    return run


@pytest.fixture(scope="module")
def digits(ropim, s3_server) -> str:
    """``ropim data convert digits s3://…/digits``."""
    uri = s3_server.uri("digits")
    proc = ropim("data", "convert", "digits", uri)
    assert f"{uri}: train 1,797 images; shards written 2" in proc.stdout
    return uri


def client(mlflow_server) -> MlflowClient:
    return MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)


def run_named(mlflow_server, experiment: str, name: str):
    c = client(mlflow_server)
    runs = c.search_runs([c.get_experiment_by_name(experiment).experiment_id],
                         filter_string=f"attributes.run_name = '{name}'")
    assert len(runs) == 1
    return runs[0]


def loss_steps(mlflow_server, run_id: str, key: str = "loss") -> list[int]:
    return sorted(m.step for m in client(mlflow_server).get_metric_history(run_id, key))


def files(s3_server, prefix: str) -> list[str]:
    """Object keys under ``prefix``, without pyarrow's empty folder markers (``…/``)."""
    return [k for k in s3_server.keys(prefix) if not k.endswith("/")]


def test_convert_writes_shards_to_the_bucket(digits, s3_server):
    keys = files(s3_server, "digits/")
    assert sorted(keys) == ["digits/classes.json", "digits/ropim_convert.json", "digits/train-00000.parquet",
                            "digits/train-00001.parquet"]


def test_a_parquet_source_in_the_bucket_is_shuffled_through_staging_there(ropim, digits, s3_server):
    uri = s3_server.uri("digits-mixed")
    proc = ropim("data", "convert", digits, uri, "--shard-size", "600")
    assert f"{uri}: train 1,797 images; shards written 3" in proc.stdout
    assert sorted(files(s3_server, "digits-mixed/")) == [  # the staging folder removed
        "digits-mixed/classes.json", "digits-mixed/ropim_convert.json", *(f"digits-mixed/train-0000{k}.parquet"
                                                                         for k in range(3))]


@pytest.mark.parametrize("ingest", ["ray_data", "torch"])
def test_pretrain_from_s3_to_s3_on_two_nodes(ingest, ropim, digits, s3_server, mlflow_server):
    name = f"s3-{ingest.replace('_', '-')}"
    runs = s3_server.uri("runs")
    args = (*TINY, "--data.source", digits, "--storage_path", runs, "--run_name", name, "--ingest", ingest,
            "--num_workers", "2", "--cpus_per_worker", "0.5" if ingest == "ray_data" else "1",
            "--placement_strategy", "SPREAD")
    if ingest == "torch":  # one epoch, stop; the same command continues from the checkpoint in the bucket
        first = ropim("pretrain", *args, "--stop_after_epochs", "1")
        # a run outside the default ray_results is continued by naming its storage too
        assert f"stopped after epoch 1/2; continue with `ropim pretrain --resume {name} --storage_path {runs}`" \
            in first.stdout
        run = run_named(mlflow_server, "ropim-pretrain", name)
        assert run.info.status == "KILLED" and loss_steps(mlflow_server, run.info.run_id) == [1]
    done = ropim("pretrain", *args)
    encoder_uri = done.stdout.strip().splitlines()[-1]
    assert encoder_uri.startswith("models:/ropim-encoder/")

    run = run_named(mlflow_server, "ropim-pretrain", name)  # one MLflow run, continued
    assert run.info.status == "FINISHED" and run.data.tags["ropim.encoder_uri"] == encoder_uri
    assert loss_steps(mlflow_server, run.info.run_id) == [1, 2]  # each epoch recorded once
    assert run.data.metrics["step"] == 6
    assert run.data.params["data.source"] == digits and run.data.params["storage_path"] == runs
    keys = files(s3_server, f"runs/{name}/")
    meta = json.loads(s3_server.client().get_object(Bucket=s3_server.bucket,
                                                    Key=f"runs/{name}/ropim_run.json")["Body"].read())
    assert meta["run_id"] == run.info.run_id and meta["model_uri"] == encoder_uri
    assert meta["checkpoint"].startswith(f"{runs}/{name}/checkpoint_")
    assert f"runs/{name}/.lock" not in keys  # released
    checkpoints = {k.split("/")[2] for k in keys if k.count("/") > 2 and k.split("/")[2].startswith("checkpoint_")}
    assert len(checkpoints) == 2  # keep_checkpoints
    assert list(ropim.cwd.iterdir()) == []  # nothing written locally (no ray_results/, no folder named 's3:')


def test_finetune_in_process_with_checkpoints_and_mlflow_artifacts_in_the_bucket(ropim, digits, s3_server,
                                                                                 mlflow_server):
    encoder = run_named(mlflow_server, "ropim-pretrain", "s3-torch").data.tags["ropim.encoder_uri"]
    proc = ropim("finetune", "--preset", "digits_demo", "--encoder", encoder, "--data.source", digits,
                 "--storage_path", s3_server.uri("finetune") + "/",  # as copied from a console: the slash kept
                 "--run_name", "ft-s3", "--num_workers", "0",
                 "--epochs", "2", "--batch_size", "16", "--max_steps_per_epoch", "2", "--warmup_epochs", "0")
    assert "registered classifier models:/ropim-classifier/1" in proc.stdout
    run = run_named(mlflow_server, "ropim-finetune", "ft-s3")
    assert run.info.status == "FINISHED" and loss_steps(mlflow_server, run.info.run_id, "train_loss") == [1, 2]
    keys = files(s3_server, "finetune/ft-s3/in_process/")
    assert sorted({k.split("/")[3] for k in keys}) == ["checkpoint_000001", "checkpoint_000002"]
    assert "finetune/ft-s3/in_process/checkpoint_000002/.complete" in keys  # marked complete, written last
    # MLflow's artifacts (both registered models, the run's files) went through the server into the bucket
    artifacts = s3_server.keys("mlartifacts/")
    assert any(k.endswith("/encoder.safetensors") for k in artifacts)
    assert any(k.startswith(f"mlartifacts/{run.info.experiment_id}/{run.info.run_id}/") for k in artifacts)


def test_no_credential_is_logged_printed_or_written(ropim, s3_server, mlflow_server, ray_cluster):
    """Last in the module: every MLflow run, every registered version, every command's output, every file of
    the cluster's nodes."""
    secrets = [s3_server.env["AWS_SECRET_ACCESS_KEY"], s3_server.env["AWS_ACCESS_KEY_ID"]]
    c = client(mlflow_server)
    experiments = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(experiments, max_results=1000)
    assert len(runs) >= 3
    values = [v for r in runs for v in (*r.data.params.values(), *r.data.tags.values())]
    values += [v for mv in c.search_model_versions() for v in (*mv.tags.values(), mv.description or "")]
    assert len(ropim.outputs) >= 5
    for secret in secrets:
        assert not [v for v in values if secret in v]
        assert not [out for out in ropim.outputs if secret in out]
    assert ray_cluster.files_containing(secrets[0]) == []
    assert s3_server.secret not in mlflow_server.log.read_text()
