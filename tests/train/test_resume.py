"""Pretraining that survives: worker death, stop + resume, interrupted checkpoint writes (2 CPU workers)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ropim import registry
from ropim.checkpoint import read_run_meta
from ropim.errors import ConfigError
from ropim.model import ModelConfig
from ropim.train import PretrainConfig, pretrain, resume_config

TINY = PretrainConfig(model=ModelConfig(img_size=32, patch_size=4, depth=1), epochs=3, global_batch_size=16,
                      max_steps_per_epoch=2, num_workers=2, cpus_per_worker=1, warmup_epochs=1, log_every=100)


@pytest.fixture(scope="module", autouse=True)
def session(workdir, ray_session):
    """Every test here runs in the module's working directory and Ray session."""
    return workdir


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(registry.client().get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def straight():
    """An uninterrupted run: the reference for the others."""
    return pretrain(dataclasses.replace(TINY, run_name="straight"))


def test_stopped_and_resumed_run_matches_uninterrupted(straight):
    cfg = dataclasses.replace(TINY, run_name="stop-resume")
    first = pretrain(dataclasses.replace(cfg, stop_after_epochs=1))
    assert first.encoder_uri is None and first.metrics["epoch"] == 1 and first.metrics["step"] == 2
    assert registry.client().get_run(first.run_id).info.status == "KILLED"

    resumed = pretrain(resume_config("stop-resume", cfg.storage_path, num_workers=2))
    assert resumed.run_id == first.run_id  # the same MLflow run continues
    assert resumed.encoder_uri is not None
    assert resumed.metrics["step"] == straight.metrics["step"] == 6
    assert _history(resumed.run_id, "lr") == _history(straight.run_id, "lr")
    assert [s for s, _ in _history(resumed.run_id, "loss")] == [1, 2, 3]
    for (_, a), (_, b) in zip(_history(resumed.run_id, "loss"), _history(straight.run_id, "loss"), strict=True):
        assert a == pytest.approx(b, rel=1e-4)  # same data order, sketches and weights after the resume
    assert registry.client().get_run(resumed.run_id).info.status == "FINISHED"


def test_rerun_with_changed_config_is_refused(straight):
    with pytest.raises(ConfigError, match="already exists .* different config .*base_lr"):
        pretrain(dataclasses.replace(TINY, run_name="straight", base_lr=0.5))


def test_worker_death_restarts_from_latest_checkpoint(tmp_path, straight):
    marker = tmp_path / "crashed"

    def crash_once(config: dict) -> None:
        import ropim.train as t

        original = t.sketch_generator

        def generator(seed, step, rank, device):
            if step == 3 and rank == 1 and not marker.exists():
                marker.write_text("x")
                os._exit(1)  # a hard worker death, mid-epoch 2
            return original(seed, step, rank, device)

        t.sketch_generator = generator
        t.train_loop_per_worker(config)

    result = pretrain(dataclasses.replace(TINY, run_name="crash"), train_loop=crash_once)
    assert marker.exists()
    assert result.metrics["epoch"] == 3 and result.metrics["step"] == straight.metrics["step"]
    assert result.encoder_uri is not None


def test_interrupted_checkpoint_write_keeps_previous_latest(tmp_path, straight):
    marker, restored = tmp_path / "interrupted", tmp_path / "restored"

    def break_second_save(config: dict) -> None:
        import ropim.train as t

        save, load = t.save_checkpoint, t.load_checkpoint

        def partial_save(folder, model, optimizer, scaler, epoch, step, cfg):
            if epoch == 1 and not marker.exists():
                marker.write_text("x")
                (Path(folder) / "model.safetensors").write_bytes(b"half a file")
                raise RuntimeError("killed while writing the checkpoint")
            save(folder, model, optimizer, scaler, epoch, step, cfg)

        def recording_load(folder, *args):
            state = load(folder, *args)
            restored.write_text(str(state["epoch"]))
            return state

        t.save_checkpoint, t.load_checkpoint = partial_save, recording_load
        t.train_loop_per_worker(config)

    result = pretrain(dataclasses.replace(TINY, run_name="interrupted"), train_loop=break_second_save)
    assert marker.exists()
    assert restored.read_text() == "0"  # resumed from epoch 1's checkpoint, not the half-written one
    assert result.metrics["step"] == straight.metrics["step"]
    assert read_run_meta(TINY.storage_path, "interrupted")["run_id"] == result.run_id


def test_pretrain_reads_parquet_through_ray_data_with_two_workers_on_two_cpus(tmp_path):
    from ropim.convert import convert
    from ropim.data import DataConfig

    shards = tmp_path / "digits-parquet"
    convert(DataConfig(source="digits"), str(shards), shard_size=400, progress=False)
    cfg = dataclasses.replace(TINY, run_name="ray-data", ingest="ray_data", cpus_per_worker=0.5, epochs=2,
                              data=DataConfig(source=str(shards)))
    result = pretrain(cfg)
    assert result.metrics["step"] == 4 and result.encoder_uri is not None
    history = _history(result.run_id, "bad_images")
    assert [v for _, v in history] == [0.0, 0.0]
