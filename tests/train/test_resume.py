"""Pretraining on Ray Train survives a worker that dies mid-epoch: the worker group restarts from the latest
checkpoint and finishes with the uninterrupted step count, every epoch recorded once, one registered encoder —
here with Ray Data ingest from Parquet, 2 workers on 2 CPUs (the setting that used to hang)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal

import pytest
from support import tiny_pretrain

from ropim.data.config import DataConfig
from ropim.data.convert import convert
from ropim.errors import ConfigError
from ropim.tracking import store
from ropim.train.driver import run


@pytest.mark.faults
def test_worker_death_restarts_from_latest_checkpoint_with_ray_data(workdir, ray_session, tmp_path):
    shards = tmp_path / "digits-parquet"
    convert(DataConfig(source="digits"), str(shards), shard_size=400, progress=False)
    cfg = tiny_pretrain(run_name="crash", epochs=2, max_steps_per_epoch=2, num_workers=2, cpus_per_worker=0.5,
                        ingest="ray_data", data=DataConfig(source=str(shards)))
    marker = str(tmp_path / "crashed")

    def crash_once(config: dict, worker) -> None:  # nested: Ray pickles it by value
        """The pretraining worker, except that rank 1 dies hard (``os._exit``) at optimizer step 3, once."""
        from ropim.train.driver import worker_main
        from ropim.train.pretrain import task as module

        original = module.sketch_generator

        def generator(seed, step, rank, device):
            if step == 3 and rank == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # a hard worker death in epoch 2
            return original(seed, step, rank, device)

        module.sketch_generator = generator  # in this worker process only
        worker_main(config, worker)

    def hung(*_):
        raise TimeoutError("pretraining with Ray Data did not finish in 300 s: the 2-CPU hang is back")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(300)
    try:
        result = run(cfg, worker_fn=crash_once)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert os.path.exists(marker)  # the worker did die
    assert result.metrics["epoch"] == 2 and result.metrics["step"] == 4 and result.model_uri is not None
    c = store.client()
    history = sorted(c.get_metric_history(result.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in history] == [1, 2]  # epoch 2, retrained after the restart, is recorded once
    assert [m.value for m in sorted(c.get_metric_history(result.run_id, "bad_images"), key=lambda m: m.step)] == \
        [0.0, 0.0]
    assert [m.step for m in c.get_metric_history(result.run_id, "step")] == [1, 2]
    versions = c.search_model_versions(f"run_id='{result.run_id}'")
    assert len(versions) == 1 and c.get_run(result.run_id).info.status == "FINISHED"


def test_resume_config_takes_only_resumable_changes(workdir):
    from ropim.errors import ConfigError
    from ropim.train.jobs import JOBS, resume_config

    with pytest.raises(ConfigError, match="no run of that name"):
        resume_config(JOBS["pretrain"], "ghost", "ray_results", num_workers=1, cpus_per_worker=0.5)
    with pytest.raises(ConfigError, match="epochs cannot change"):
        resume_config(JOBS["pretrain"], "crash", "ray_results", epochs=5)
    from ropim.tracking.run_meta import write_run_meta
    from ropim.train.pretrain.config import PretrainConfig

    write_run_meta("ray_results", "named", {"run_id": "0" * 32, "config": PretrainConfig().to_dict()})
    assert resume_config(JOBS["pretrain"], "named", "ray_results", registered_model="other").registered_model == \
        "other"  # what the result registers as is not what the run computes: it may change


# a pretraining stored as a GPU cluster ran it: what `--resume NAME` must bring back unless the command line says so
GPU_RUN = dict(num_workers=16, use_gpu=True, cpus_per_worker=4.0, placement_strategy="SPREAD", min_workers=8,
               max_failures=3, global_batch_size=512, epochs=300, warmup_epochs=10, async_checkpoint=True)


@pytest.fixture
def gpu_run(workdir, monkeypatch) -> dict:
    """A run ``gpu16`` under ``runs/``, stored with a 16-GPU shape (``ropim_run.json``: what ``open_run`` writes and
    ``--resume`` reads); ``ropim pretrain`` then stops where the driver would start (the config it was handed
    recorded), on a cluster's driver (RAY_ADDRESS: the workers' GPUs are the cluster's)."""
    from ropim.errors import ConfigError
    from ropim.tracking.runs import write_run_meta
    from ropim.train.pretrain.config import PretrainConfig

    stored = PretrainConfig(run_name="gpu16", storage_path="runs", **GPU_RUN).resolved()
    write_run_meta("runs", "gpu16", {"run_id": "0" * 32, "config": stored.to_dict()})
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    handed: dict = {}

    def driver(prepared):
        handed["cfg"] = prepared.cfg
        raise ConfigError("stopped where the driver starts")

    monkeypatch.setattr("ropim.train.driver.run", driver)
    return handed


def resume(*flags: str) -> str:
    """``ropim pretrain --resume gpu16 --storage_path runs FLAGS`` as typed (the command printed after a stop): its
    last line."""
    from ropim.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["pretrain", "--resume", "gpu16", "--storage_path", "runs", *flags])
    return str(ended.value)


def test_resume_keeps_every_stored_field_unless_typed(gpu_run, capsys):
    assert resume() == "ropim pretrain: stopped where the driver starts"  # pre-flight passed
    cfg = gpu_run.pop("cfg")
    assert {k: getattr(cfg, k) for k in GPU_RUN} == GPU_RUN  # the GPU shape, not the command line's defaults
    assert cfg.stop_after_epochs is None and capsys.readouterr().out == ""  # nothing typed, nothing changed

    # typed resumable flags override, even at their default values (max_failures 1, use_gpu false), and say so
    resume("--max_failures", "1", "--num_workers", "8", "--use_gpu", "false", "--stop_after_epochs", "2")
    cfg = gpu_run.pop("cfg")
    assert (cfg.max_failures, cfg.num_workers, cfg.use_gpu, cfg.stop_after_epochs) == (1, 8, False, 2)
    assert (cfg.min_workers, cfg.placement_strategy, cfg.cpus_per_worker) == (8, "SPREAD", 4.0)  # the rest stored
    said = capsys.readouterr().out.strip().splitlines()
    assert said == ["[pretrain] --resume gpu16: max_failures 3 -> 1, num_workers 16 -> 8, stop_after_epochs None "
                    "-> 2, use_gpu True -> False (typed); the rest as stored"]

    # on fewer GPUs, the same global batch in more micro batches (before: accum_steps could not change)
    assert resume("--num_workers", "4", "--min_workers", "2", "--accum_steps", "4") == \
        "ropim pretrain: stopped where the driver starts"
    cfg = gpu_run.pop("cfg")
    assert (cfg.num_workers, cfg.accum_steps, cfg.global_batch_size) == (4, 4, 512)


def test_resume_refuses_a_typed_field_the_run_cannot_change_before_ray(gpu_run):
    said = resume("--model.rho", "0.5", "--num_workers", "2")
    assert said.startswith("ropim pretrain: --resume gpu16: model.rho=0.5 (stored 0.14") and "\n" not in said
    assert "cannot change when continuing a run" in said and "drop --model.rho" in said
    assert "cfg" not in gpu_run  # refused before the driver: no Ray, no MLflow run
    said = resume("--epochs", "10", "--base_lr", "2e-3")  # 10: pretraining's default, typed
    assert "base_lr=0.002 (stored 0.001), epochs=10 (stored 300)" in said and "drop --base_lr --epochs" in said
    assert resume("--epochs", "300", "--model.rho", str(1 / 7)) == "ropim pretrain: stopped where the driver starts"
    assert gpu_run["cfg"].epochs == 300  # typed as stored: nothing changes, nothing refused


@pytest.mark.faults  # a checkpoint deleted under a stopped Ray run
def test_a_deleted_newest_checkpoint_falls_back_to_the_previous_one_on_ray(workdir, ray_session, capsys):
    cfg = tiny_pretrain(run_name="deleted", epochs=3, max_steps_per_epoch=2, num_workers=1)
    first = run(dataclasses.replace(cfg, stop_after_epochs=2))  # two committed checkpoints: epochs 1 and 2
    folder = workdir / "ray_results" / "deleted"
    kept = sorted(p.name for p in folder.glob("checkpoint_*") if p.is_dir())
    assert len(kept) == 2 and first.checkpoint_path == str(folder / kept[1])
    shutil.rmtree(folder / kept[1])  # the newest, gone
    capsys.readouterr()
    result = run(cfg)  # before: Ray's CheckpointManagerInitializationError
    said = [line for line in capsys.readouterr().out.splitlines() if "missing" in line]
    assert said == [f"{folder}: {kept[1]} is missing; the run continues from {kept[0]}, the newest checkpoint left"]
    assert result.metrics["epoch"] == 3 and result.metrics["step"] == 6 and result.model_uri is not None
    steps = store.client().get_metric_history(result.run_id, "step")
    assert sorted((m.step, m.value) for m in steps) == [(1, 2), (2, 4), (3, 6)]  # epoch 2 again, recorded once

    from ropim.train.snapshot import forget_missing  # what the runtime calls before Ray Train reads the list

    shutil.copytree(folder, workdir / "left")  # every checkpoint gone: one line, not a run started over
    for checkpoint in (p for p in (workdir / "left").glob("checkpoint_*") if p.is_dir()):
        shutil.rmtree(checkpoint)
    with pytest.raises(ConfigError, match=r"^no checkpoint of this run is left: checkpoint_\S+, checkpoint_\S+ "
                                          r"missing from .*left; move the run's folder away"):
        forget_missing(str(workdir / "left"))


@pytest.mark.faults  # a worker lost after its last checkpoint: the restarted group has nothing left to train
def test_a_restart_with_nothing_left_to_train_reports_the_last_epoch_again(workdir, ray_session, tmp_path):
    """What a Tune trial continued by a sweep's --resume meets when Tune's saved state missed its last result: the
    restarted workers report the checkpoint's epoch (before: nothing, so Tune kept a stale result)."""
    import ray.train

    marker, seen = str(tmp_path / "lost"), tmp_path / "reports.jsonl"

    def lost_after_training(config: dict, worker) -> None:  # nested: Ray pickles it by value
        from ropim.train.driver import worker_main

        worker_main(config, worker)
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # after the last checkpoint committed

    class Reports(ray.train.UserCallback):
        def after_report(self, run_context, metrics, checkpoint) -> None:
            with open(seen, "a") as out:
                out.write(json.dumps({"epoch": metrics[0].get("epoch"), "loss": metrics[0].get("loss"),
                                      "checkpoint": checkpoint is not None}) + "\n")

    cfg = tiny_pretrain(run_name="lost", epochs=1, max_steps_per_epoch=2, num_workers=1, max_failures=1)
    result = run(cfg, worker_fn=lost_after_training, callbacks=[Reports()])
    reports = [json.loads(line) for line in seen.read_text().splitlines()]
    assert os.path.exists(marker) and len(reports) == 2, reports
    assert reports[1] == {**reports[0], "checkpoint": False} and reports[0]["epoch"] == 1  # the same epoch again
    assert result.metrics["epoch"] == 1 and result.metrics["loss"] == reports[0]["loss"] and result.model_uri
