"""Fine-tuning on Ray Train from a registered encoder in a fresh process (alias pinned, results logged, classifier
registered and reloaded without pickle), the resolution change the BEiT/SimMIM way, and bad encoders as one line."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from support import TINY_FINETUNE, TINY_MODEL, encoder_folder, register_tiny_encoder, run_cli

from ropim.core.model import create_encoder
from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset
from ropim.errors import ConfigError
from ropim.flows.config import ProbeConfig
from ropim.flows.probe import probe
from ropim.tracking import store
from ropim.train.downstream import classifier_from
from ropim.train.driver import run
from ropim.train.finetune.config import FinetuneConfig


@pytest.fixture(scope="module")
def encoder(workdir):
    """A tiny encoder registered as ropim-encoder v1 with alias 'champion'; also kept as a local folder."""
    return register_tiny_encoder(workdir)


# ------------------------------------------------------------------------------------ fine-tune on Ray Train


@pytest.fixture(scope="module")
def ray_finetune(workdir, ray_session, encoder):
    """`ropim finetune` in a fresh process, 2 Ray Train workers, encoder given by alias."""
    proc = run_cli("finetune", "--encoder", "models:/ropim-encoder@champion", "--data.source", "digits",
                    "--num_workers", "2", "--run_name", "ft-ray", *[f"--{k}={v}" for k, v in TINY_FINETUNE.items()],
                    cwd=workdir, env={"RAY_ADDRESS": ray_session})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow  # a fresh process on 2 Ray workers (37 s); make test fine-tunes in-process and registers elsewhere
def test_finetune_from_registered_encoder_in_fresh_process_on_ray_train(ray_finetune, workdir):
    assert "[finetune] run ft-ray on 2 Ray Train workers: ropim-encoder v1 on digits" in ray_finetune.stdout
    assert "top-1" in ray_finetune.stdout.splitlines()[-1]
    c = store.client()
    run = c.search_runs([c.get_experiment_by_name("ropim-finetune").experiment_id],
                        "attributes.run_name = 'ft-ray'")[0]
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["ropim.encoder_name"] == "ropim-encoder" and tags["ropim.encoder_version"] == "1"
    assert tags["ropim.encoder_uri"] == "models:/ropim-encoder@champion"
    assert run.data.params["encoder"] == "models:/ropim-encoder/1"  # the alias, pinned once on the driver
    top1 = run.data.metrics["top1"]
    assert 0 <= top1 <= run.data.metrics["top5"] <= 100
    assert [m.step for m in c.get_metric_history(run.info.run_id, "top1")] == [1, 2]
    assert {f"class_acc.{d}" for d in range(10)} <= set(run.data.metrics)
    # the encoder version carries the downstream score
    assert c.get_model_version("ropim-encoder", "1").tags["downstream.digits.top1"] == f"{top1:.2f}"
    # results: confusion matrix as PNG + JSON
    local = Path(c.download_artifacts(run.info.run_id, "confusion.png", str(workdir)))
    with Image.open(local) as png:
        assert png.format == "PNG"
    report = json.loads(Path(c.download_artifacts(run.info.run_id, "confusion.json", str(workdir))).read_text())
    n_val = len(build_dataset(DataConfig(), "val"))
    assert np.array(report["confusion"]).sum() == n_val and report["classes"] == [str(d) for d in range(10)]
    # the classifier is registered and linked
    assert tags["ropim.classifier_uri"] == "models:/ropim-classifier/1"
    mv = c.get_model_version("ropim-classifier", "1")
    assert mv.tags["encoder_version"] == "1" and mv.tags["dataset"] == "digits"
    assert (workdir / "ray_results" / "ft-ray" / "ropim_run.json").exists()


def _final_checkpoint(run_dir: Path) -> Path:
    done = [p.parent for p in run_dir.rglob("metrics.json")
            if json.loads(p.read_text())["epoch"] == TINY_FINETUNE["epochs"]]
    assert len(done) == 1, done
    return done[0]


@pytest.mark.slow  # the classifier of the run above
def test_classifier_reloads_without_pickle_and_predicts_identically(ray_finetune, workdir):
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    np.save(workdir / "cls_x.npy", x.numpy())
    script = """
import numpy as np, torch, mlflow
from ropim.tracking.registry import load_classifier
model, cfg = load_classifier("models:/ropim-classifier/1")
x = torch.from_numpy(np.load("cls_x.npy"))
with torch.no_grad():
    np.save("cls_logits.npy", model(x).numpy())
np.save("cls_pyfunc.npy", mlflow.pyfunc.load_model("models:/ropim-classifier/1").predict(np.load("cls_x.npy")))
assert cfg["classes"] == [str(d) for d in range(10)] and cfg["num_classes"] == 10
"""
    env = {**os.environ, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=workdir, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]

    final = _final_checkpoint(workdir / "ray_results" / "ft-ray")
    config = json.loads((workdir / "enc-local" / "config.json").read_text())
    reference = classifier_from(config, None, 10).eval()
    reference.load_state_dict(load_file(str(final / "model.safetensors")))
    with torch.no_grad():
        expected = reference(x).numpy()
    np.testing.assert_array_equal(np.load(workdir / "cls_logits.npy"), expected)
    np.testing.assert_allclose(np.load(workdir / "cls_pyfunc.npy"), expected, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ bad input


def test_wrong_uri_missing_alias_and_channel_mismatch_are_one_clear_error(workdir, encoder):
    c = store.client()
    before = len(c.search_runs([e.experiment_id for e in c.search_experiments()]))
    gray = encoder_folder(workdir / "enc-gray", dataclasses.replace(TINY_MODEL, in_chans=1))
    cases = [
        ("models:/ropim-encoder@nope", LookupError, "no alias 'nope'"),
        ("models:/ropim-encoder/99", LookupError, "no such registered version"),
        ("models:/no-such-model/1", LookupError, "no such registered version"),
        ("runs:/0123456789abcdef/encoder", LookupError, "no MLflow run '0123456789abcdef'"),
        (str(workdir / "no-such-folder"), FileNotFoundError, "no such local folder"),
        (str(gray), ConfigError, "expects 1-channel images (in_chans=1), and every data source gives 3-channel"),
    ]
    for uri, err, message in cases:
        with pytest.raises(err, match=message.replace("(", r"\(").replace(")", r"\)")):
            run(FinetuneConfig(encoder=uri, num_workers=2, **TINY_FINETUNE))
    with pytest.raises(ConfigError, match="expects 1-channel"):
        probe(ProbeConfig(encoder=str(gray)))
    assert len(c.search_runs([e.experiment_id for e in c.search_experiments()])) == before  # nothing started


@pytest.mark.parametrize(("command", "encoder_arg", "message"), [
    ("finetune", "models:/ropim-encoder@nope", "ropim finetune: encoder models:/ropim-encoder@nope: no alias 'nope'"),
    ("probe", "enc-gray", "expects 1-channel images"),
])
def test_cli_bad_encoder_is_one_line_before_ray(workdir, encoder, command, encoder_arg, message):
    if encoder_arg == "enc-gray":
        encoder_folder(workdir / "enc-gray", dataclasses.replace(TINY_MODEL, in_chans=1))
    proc = run_cli(command, "--encoder", encoder_arg, "--data.source", "digits", cwd=workdir, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "Started a local Ray instance" not in proc.stderr


def test_resolution_change_is_logged_once(caplog):
    torch.manual_seed(0)
    enc = create_encoder(TINY_MODEL)
    config = json.loads((encoder_folder(Path("enc-log")) / "config.json").read_text())
    with caplog.at_level(logging.INFO, logger="ropim"):
        same = classifier_from(config, enc.state_dict(), 10, 32, uri="enc-a")
        assert "resampled" not in caplog.text
        bigger = classifier_from(config, enc.state_dict(), 10, 48, uri="enc-a")
        classifier_from(config, enc.state_dict(), 10, 48, uri="enc-a", quiet=True)
    assert caplog.text.count("position embedding resampled from a 8x8 to a 12x12 grid") == 1
    assert "encoder enc-a" in caplog.text and "pretrained at 32x32" in caplog.text
    assert torch.equal(same.pos_embed, enc.pos_embed) and bigger.pos_embed.shape == (1, 1 + 12 * 12, enc.embed_dim)
