"""The one training loop, in this process (num_workers=0): a stopped and resumed run repeats the uninterrupted one
exactly, for pretraining and fine-tuning alike; checkpoints rotate; a half-written checkpoint is never the latest;
gradient accumulation keeps the step count; a finished run is reported, not trained or registered again."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path

import pytest
import torch
from gloo_loop import ToyTask, toy_loop_config
from support import encoder_folder, tiny_finetune, tiny_pretrain

from ropim.console import Pace
from ropim.tracking import store
from ropim.train import checkpoint, downstream, loop
from ropim.train import task as task_module
from ropim.train.driver import run
from ropim.train.jobs import JOBS, resume_config
from ropim.train.runtime import LocalWorker

LOCAL = dict(num_workers=0, epochs=3, max_steps_per_epoch=2)


def history(run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in sorted(store.client().get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.fixture(scope="module")
def straight(workdir):
    """An uninterrupted in-process pretraining: the reference for the others."""
    return run(tiny_pretrain(run_name="straight", **LOCAL))


def test_pretraining_stopped_and_resumed_matches_uninterrupted(straight):
    cfg = tiny_pretrain(run_name="stop-resume", stop_after_epochs=1, **LOCAL)
    first = run(cfg)
    assert first.model_uri is None and first.metrics["epoch"] == 1 and first.metrics["step"] == 2
    assert store.client().get_run(first.run_id).info.status == "KILLED"

    resumed = run(resume_config(JOBS["pretrain"], "stop-resume", cfg.storage_path, num_workers=0))
    assert resumed.run_id == first.run_id and resumed.model_uri is not None  # the same MLflow run continues
    assert resumed.metrics["step"] == straight.metrics["step"] == 6
    assert history(resumed.run_id, "lr") == history(straight.run_id, "lr")
    assert [s for s, _ in history(resumed.run_id, "loss")] == [1, 2, 3]  # no epoch logged twice
    for (_, a), (_, b) in zip(history(resumed.run_id, "loss"), history(straight.run_id, "loss"), strict=True):
        assert a == pytest.approx(b, rel=1e-6)  # same data order, augmentation, sketches and weights
    assert store.client().get_run(resumed.run_id).info.status == "FINISHED"

    versions = store.client().search_model_versions("name='ropim-encoder'")
    # finished: reported only
    again = run(resume_config(JOBS["pretrain"], "stop-resume", cfg.storage_path, num_workers=0))
    assert again.model_uri == resumed.model_uri and again.run_id == resumed.run_id
    assert len(store.client().search_model_versions("name='ropim-encoder'")) == len(versions)


def test_checkpoints_rotate_and_hold_the_epochs_metrics(straight):
    folder = Path("ray_results/straight/in_process")
    kept = sorted(p.name for p in folder.glob("checkpoint_*"))
    assert kept == ["checkpoint_000002", "checkpoint_000003"]  # keep_checkpoints=2
    metrics = json.loads((folder / "checkpoint_000003" / "metrics.json").read_text())
    assert metrics["epoch"] == 3 and metrics["step"] == 6 and metrics["loss"] > 0
    assert {"model.safetensors", "train_state.pt", "config.json"} <= {p.name for p in (folder / kept[-1]).iterdir()}


def test_half_written_checkpoint_is_never_the_latest(workdir, straight, monkeypatch):
    save = checkpoint.save_checkpoint

    def broken_second_save(folder, model, optimizer, scaler, epoch, step, config):
        if epoch == 1:
            (Path(folder) / "model.safetensors").write_bytes(b"half a file")
            raise RuntimeError("killed while writing the checkpoint")
        save(folder, model, optimizer, scaler, epoch, step, config)

    monkeypatch.setattr(checkpoint, "save_checkpoint", broken_second_save)
    cfg = tiny_pretrain(run_name="half-written", **LOCAL)
    with pytest.raises(RuntimeError, match="killed while writing"):
        run(cfg)
    worker = LocalWorker(Path("ray_results/half-written/in_process").absolute(), 2)
    assert [p.name for p in worker.checkpoints()] == ["checkpoint_000001"]
    assert store.client().get_run(history_run("half-written")).info.status == "FAILED"
    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    result = run(cfg)  # the same command again continues from epoch 1's checkpoint
    assert result.metrics["step"] == straight.metrics["step"] and result.model_uri is not None
    assert history(result.run_id, "lr") == history(straight.run_id, "lr")


def history_run(name: str) -> str:
    return json.loads(Path(f"ray_results/{name}/ropim_run.json").read_text())["run_id"]


def test_gradient_accumulation_keeps_steps_and_images(workdir):
    result = run(tiny_pretrain(run_name="accum", accum_steps=2, num_workers=0, epochs=1, max_steps_per_epoch=2))
    assert result.metrics["step"] == 2 and result.metrics["epoch"] == 1  # 2 optimizer steps of 2 micro batches


def test_the_last_epochs_knn_says_its_progress(workdir, monkeypatch, caplog):
    # the last epoch's kNN runs before the epoch line (a 1.28 M-image feature extraction on ImageNet): with the
    # period at 0 it speaks after each batch of 256 but the last; epoch 1's, beside training, stays silent
    monkeypatch.setattr(downstream, "Pace", functools.partial(Pace, every=0.0))
    with caplog.at_level(logging.INFO, logger="ropim"):
        run(tiny_pretrain(run_name="knn-pace", num_workers=0, epochs=2, max_steps_per_epoch=1, eval_every=1))
    paced = [r.getMessage().split(" images ")[0] for r in caplog.records if " features: " in r.getMessage()]
    assert paced == [f"[pretrain] epoch 2 kNN, train features: {n}/1438" for n in range(256, 1438, 256)] + [
        "[pretrain] epoch 2 kNN, val features: 256/359"]


def test_finetune_stopped_and_resumed_matches_uninterrupted(workdir, monkeypatch, caplog):
    enc = str(encoder_folder(workdir / "enc"))
    cfg = tiny_finetune(enc, num_workers=0, registered_model="")
    monkeypatch.setattr(task_module, "Pace", functools.partial(Pace, every=0.0))  # a progress line per val batch
    with caplog.at_level(logging.INFO, logger="ropim.train"):
        straight = run(dataclasses.replace(cfg, run_name="ft-straight"))
    paced = [r.getMessage() for r in caplog.records if " val, rank 0's share: " in r.getMessage()]
    assert paced[0].startswith("[finetune] epoch 1 val, rank 0's share: 64/359 images "), paced  # digits' val split
    first = run(dataclasses.replace(cfg, run_name="ft-resume", stop_after_epochs=1))
    c = store.client()
    assert first.metrics["epoch"] == 1 and first.metrics["step"] == 2
    assert c.get_run(first.run_id).info.status == "KILLED"
    resumed = run(dataclasses.replace(cfg, run_name="ft-resume"))
    assert resumed.run_id == first.run_id and resumed.metrics["epoch"] == 2 and resumed.metrics["step"] == 4
    assert c.get_run(resumed.run_id).info.status == "FINISHED"
    assert resumed.metrics["top1"] == pytest.approx(straight.metrics["top1"])
    assert resumed.metrics["top5"] == pytest.approx(straight.metrics["top5"])
    assert resumed.metrics["train_loss"] == pytest.approx(straight.metrics["train_loss"], rel=1e-5)
    assert resumed.model_uri is None  # registered_model="" keeps the registry clean
    again = run(dataclasses.replace(cfg, run_name="ft-resume"))  # finished: reported, not re-trained
    assert again.run_id == resumed.run_id and again.metrics["top1"] == pytest.approx(resumed.metrics["top1"])
    assert [m.step for m in c.get_metric_history(resumed.run_id, "top1")] == [1, 2]
    assert [m.step for m in c.get_metric_history(resumed.run_id, "train_loss")] == [1, 2]
    with pytest.raises(Exception, match="already exists .* different config .*base_lr"):
        run(dataclasses.replace(cfg, run_name="ft-resume", base_lr=0.5))


def test_step_lines_count_the_later_epochs_at_the_measured_epoch_period(tmp_path, caplog):
    # the epoch lines measured an hour from one to the next: the step lines of epoch 1 of 3 have two such to go,
    # those of the last epoch only its own steps (before, the run's steps left at this epoch's rate: seconds)
    task = ToyTask({0: 4}, 2, str(tmp_path))
    task.epoch_period = 3600.0
    with caplog.at_level(logging.INFO, logger="ropim.train"):
        loop.Loop(task, toy_loop_config(epochs=3, log_every=1), LocalWorker(tmp_path, 1)).run()
    etas = [r.getMessage().rsplit(" ETA ", 1)[1] for r in caplog.records if " step " in r.getMessage()]
    assert etas[:2] == ["2.0 h", "2.0 h"] and etas[-1] == "0.0 min", etas


def test_a_resumed_run_with_dataloader_processes_augments_as_the_uninterrupted_one(workdir):
    """With ``dataloader_workers`` the images are augmented in the loader's processes: each epoch's augmentations come
    from (seed, epoch, rank) there too, so a stopped and resumed run trains on the uninterrupted one's images."""
    loader = dict(LOCAL, dataloader_workers=1)
    straight = run(tiny_pretrain(run_name="straight-loader", **loader))
    cfg = tiny_pretrain(run_name="stop-resume-loader", stop_after_epochs=1, **loader)
    run(cfg)
    resumed = run(resume_config(JOBS["pretrain"], "stop-resume-loader", cfg.storage_path, num_workers=0))
    for (_, a), (_, b) in zip(history(resumed.run_id, "loss"), history(straight.run_id, "loss"), strict=True):
        assert a == pytest.approx(b, rel=1e-6)


@pytest.mark.parametrize("clip", [1e-6, 1e6])
def test_each_epoch_reports_the_gradient_norm_before_clipping_and_the_share_clipped(tmp_path, clip):
    """One step an epoch (2 micro batches) on the toy task: the norm is the same whatever ``clip_grad`` does to it
    afterwards; a bound under it clips every step, a bound over it none."""
    seen = []
    task = ToyTask({0: 2}, 1, str(tmp_path))
    task.epoch_end = lambda model, metrics: seen.append(metrics)
    cfg = dataclasses.replace(toy_loop_config(epochs=1), clip_grad=clip)
    loop.Loop(task, cfg, LocalWorker(tmp_path, 1)).run()
    unclipped = []
    plain = ToyTask({0: 2}, 1, str(tmp_path / "plain"))
    plain.epoch_end = lambda model, metrics: unclipped.append(metrics)
    loop.Loop(plain, toy_loop_config(epochs=1), LocalWorker(tmp_path / "plain", 1)).run()
    assert seen[0]["grad_norm"] == pytest.approx(unclipped[0]["grad_norm"]) and seen[0]["grad_norm"] > 1e-3
    assert seen[0]["clipped_share"] == (1.0 if clip < 1 else 0.0)
    assert "clipped_share" not in unclipped[0]  # no clip_grad: nothing to count


def test_a_runs_gradient_norms_are_in_mlflow(straight):
    norms, clipped = history(straight.run_id, "grad_norm"), history(straight.run_id, "clipped_share")
    assert [s for s, _ in norms] == [s for s, _ in clipped] == [1, 2, 3]  # every epoch, pretraining's clip_grad 5.0
    assert all(v > 0 for _, v in norms) and all(0 <= v <= 1 for _, v in clipped)


def test_steps_fp16s_scaler_skips_are_counted_and_left_out_of_the_norm(tmp_path):
    """A grad scaler (fp16's; here torch's CPU one) skips the first step, whose loss is infinite: the epoch reports 1
    skipped step of 2, and the norm is the applied step's alone."""

    class FirstInfinite(ToyTask):
        def loss(self, model, batch, step):
            loss, n = super().loss(model, batch, step)
            return (loss * float("inf") if step == 0 else loss), n

    seen = []
    task = FirstInfinite({0: 4}, 2, str(tmp_path))
    task.epoch_end = lambda model, metrics: seen.append(metrics)
    run_loop = loop.Loop(task, toy_loop_config(epochs=1), LocalWorker(tmp_path, 1))
    run_loop.scaler = torch.amp.GradScaler("cpu")
    run_loop.run()
    assert seen[0]["skipped_steps"] == 1 and 0 < seen[0]["grad_norm"] < float("inf")
    assert run_loop.step == 2
