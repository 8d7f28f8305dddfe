"""`ropim segment`: a tiny ADE20K-layout folder written here, segmented through the command line on 1 Ray Train
worker from a registered encoder (relative paths), the segmenter registered with its card and lineage and read back
in a fresh process with identical outputs; the built-in digits in this process with the poly schedule."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from support import InLoaderProcess, encoder_folder, run_cli, write_ade20k

from ropim.console import Pace
from ropim.core.config import ModelConfig
from ropim.core.upernet import build_segmenter
from ropim.data.config import SegDataConfig
from ropim.tracking import registry, store
from ropim.train import task as task_module
from ropim.train.driver import run
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig

ENCODER = ModelConfig(img_size=32, patch_size=8, depth=2)  # the demo encoder's shape, 2 blocks
TINY = ["--crop_size", "32", "--epochs", "1", "--batch_size", "2", "--max_steps_per_epoch", "2", "--channels", "8",
        "--aux_channels", "8", "--log_every", "1", "--viz_images", "2"]


@pytest.fixture(scope="module")
def encoder(workdir):
    """The demo-shaped encoder registered as ropim-encoder v1 (alias champion)."""
    folder = encoder_folder(workdir / "enc", ENCODER)
    state, config = load_file(str(folder / "encoder.safetensors")), json.loads((folder / "config.json").read_text())
    run_id = store.create_run("ropim-pretrain", "enc", PretrainConfig(model=ENCODER).to_dict())
    uri = registry.register_encoder(run_id, state, config)
    store.end_run(run_id)
    store.client().set_registered_model_alias("ropim-encoder", "champion", "1")
    return uri


@pytest.fixture(scope="module")
def ray_segment(workdir, ray_session, encoder):
    write_ade20k(workdir / "ade")
    proc = run_cli("segment", "--encoder", "models:/ropim-encoder@champion", "--data.source", "ade",
                   "--num_workers", "1", "--run_name", "seg-ray", *TINY, cwd=workdir, env={"RAY_ADDRESS": ray_session})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow  # the segmentation job whole on Ray (make test segments in this process)
def test_segment_an_ade20k_folder_on_one_ray_worker(ray_segment, workdir):
    out = ray_segment.stdout
    assert "[segment] run seg-ray on 1 Ray Train workers: ropim-encoder v1 on ade at 32px crops" in out
    assert "registered segmenter models:/ropim-segmenter/1" in out and out.splitlines()[-1].startswith("mIoU ")
    c = store.client()
    run = c.search_runs([c.get_experiment_by_name("ropim-segment").experiment_id], "attributes.run_name = 'seg-ray'")[0]
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    assert {"miou", "pixel_acc", "final_miou", "train_loss", "lr"} <= set(metrics)
    ious = {k for k in metrics if k.startswith("iou.")}
    assert ious and all(k[4:].isdigit() and 1 <= int(k[4:]) <= 150 for k in ious)  # ADE's class names 1..150
    assert run.data.tags["ropim.encoder_version"] == "1"
    artifacts = {a.path for a in c.list_artifacts(run.info.run_id)}
    assert {"segmentation.png", "per_class_iou.json"} <= artifacts
    per_class = json.loads(Path(c.download_artifacts(run.info.run_id, "per_class_iou.json")).read_text())
    assert len(per_class["classes"]) == 150 and per_class["classes"][2] == "3"
    version = c.get_model_version("ropim-encoder", "1")
    assert "downstream.ade.miou" in version.tags  # the encoder learns where it was used


@pytest.mark.slow  # the segmentation job whole on Ray (make test segments in this process)
def test_registered_segmenter_reads_back_in_a_fresh_process_with_identical_outputs(ray_segment, workdir):
    checkpoint = sorted(p for p in Path("ray_results/seg-ray").glob("checkpoint_*") if p.is_dir())[-1]
    config = json.loads((checkpoint / "metrics.json").read_text())["eval"]["segmenter"]
    model = build_segmenter(config)
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")))
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    np.save(workdir / "x.npy", x.numpy())
    with torch.no_grad():
        expected = model.eval()(x).numpy()
    script = ("import numpy as np, mlflow\n"
              "from ropim.tracking.segmenters import load_segmenter\n"
              "x = np.load('x.npy')\n"
              "model, config = load_segmenter('models:/ropim-segmenter/1')\n"
              "import torch\n"
              "np.save('ropim.npy', model(torch.from_numpy(x)).detach().numpy())\n"
              "np.save('pyfunc.npy', mlflow.pyfunc.load_model('models:/ropim-segmenter/1').predict(x))\n"
              "print(config['classes'][149], config['encoder_uri'])\n")
    env = {**os.environ, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["150", "models:/ropim-encoder/1"]
    np.testing.assert_array_equal(np.load(workdir / "ropim.npy"), expected)
    pyfunc = torch.from_numpy(np.load(workdir / "pyfunc.npy"))  # upsampled to the input size
    up = torch.nn.functional.interpolate(torch.from_numpy(expected), size=(32, 32), mode="bilinear")
    torch.testing.assert_close(pyfunc, up)


@pytest.mark.slow  # the segmentation job whole on Ray (make test segments in this process)
def test_models_list_and_show_the_segmenter_with_its_lineage(ray_segment, workdir):
    listed = run_cli("models", "list", "--name", "ropim-segmenter", cwd=workdir)
    assert listed.returncode == 0, listed.stderr
    assert "mIoU on ade" in listed.stdout
    shown = run_cli("models", "show", "models:/ropim-segmenter/1", cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    assert "- encoder: models:/ropim-encoder/1" in shown.stdout
    assert 'load_segmenter("models:/ropim-segmenter/1")' in shown.stdout
    encoder_card = run_cli("models", "show", "models:/ropim-encoder/1", cwd=workdir).stdout
    assert "segmentations: seg-ray" in encoder_card and "segmentation mIoU on ade" in encoder_card


def test_digits_in_this_process_follow_warm_up_then_poly_decay(workdir, encoder, monkeypatch, caplog):
    monkeypatch.setattr(task_module, "Pace", functools.partial(Pace, every=0.0))  # a progress line per image
    cfg = SegmentConfig(encoder="enc", data=SegDataConfig(canvases=20, canvas_size=32), crop_size=32, epochs=4,
                        batch_size=2, max_steps_per_epoch=2, warmup_epochs=0, lr=1e-3, channels=8, aux_channels=8,
                        num_workers=0, viz_images=0, registered_model="", run_name="seg-digits")
    with caplog.at_level(logging.INFO, logger="ropim.train"):
        result = run(cfg)
    assert result.metrics["epoch"] == 4 and 0 <= result.metrics["miou"] <= 100 and result.model_uri is None
    paced = [r.getMessage() for r in caplog.records if " val, rank 0's share: " in r.getMessage()]
    assert paced and all(re.fullmatch(r"\[segment\] epoch [1-4] val, rank 0's share: \d+/\d+ images [\d.]+ img/s "
                                      r"ETA [\d.]+ min", line) for line in paced), paced
    lr = [m.value for m in sorted(store.client().get_metric_history(result.run_id, "lr"), key=lambda m: m.step)]
    assert lr == pytest.approx([7.5e-4, 5e-4, 2.5e-4, 0.0])  # linear to 0 over the 8 steps (poly, power 1)
    again = run(cfg)  # a finished run is reported, not trained again
    assert again.run_id == result.run_id


def test_val_images_decode_in_dataloader_processes_to_the_same_confusion():
    from ropim.data.seg_datasets import build_seg_dataset, seg_eval_transform
    from ropim.train.segment.task import evaluate_confusion

    cfg = SegmentConfig(encoder="enc", data=SegDataConfig(canvases=12, canvas_size=32), crop_size=32)
    val = build_seg_dataset(cfg.data, "val", seg_eval_transform(32))
    torch.manual_seed(0)
    model, k = torch.nn.Conv2d(3, len(val.classes), 1), len(val.classes)
    here = evaluate_confusion(model, val, range(len(val)), cfg, k, torch.device("cpu"))
    there = evaluate_confusion(model, InLoaderProcess(val), range(len(val)), cfg, k, torch.device("cpu"), processes=2)
    assert here.sum() > 0 and torch.equal(here, there)


def test_a_sliding_stride_above_the_crop_is_refused_and_ignored_when_not_sliding():
    """Windows farther apart than a crop leave the pixels between them unpredicted (a silently wrong mIoU): refused
    for ``eval_mode=slide``; with ``whole`` the stride is not used, so any value stands."""
    from ropim.errors import ConfigError

    with pytest.raises(ConfigError, match=r"eval_stride=65 > crop_size=64: the sliding windows would skip"):
        SegmentConfig(crop_size=64, eval_stride=65).check()
    SegmentConfig(crop_size=64, eval_stride=64).check()
    SegmentConfig(crop_size=64, eval_stride=341, eval_mode="whole").check()
