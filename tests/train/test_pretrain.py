"""End to end on CPU: 2-worker Ray Train pretraining -> MLflow registry -> reload in a fresh process -> fine-tune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ropim import registry
from ropim.data import DataConfig
from ropim.evaluate import FinetuneConfig, finetune
from ropim.model import ModelConfig, create_encoder
from ropim.train import PretrainConfig, pretrain

TINY = ModelConfig(img_size=32, patch_size=4, depth=2)


@pytest.fixture(scope="module")
def pretrained(workdir, ray_session):
    cfg = PretrainConfig(model=TINY, epochs=2, global_batch_size=16, max_steps_per_epoch=3, num_workers=2,
                         run_name="tiny")
    return cfg, pretrain(cfg)


def test_two_worker_pretrain_logs_and_registers(pretrained):
    cfg, result = pretrained
    assert result.metrics["step"] == 6 and result.metrics["epoch"] == 2
    assert result.encoder_uri.startswith("models:/ropim-encoder/")
    c = registry.client()
    run = c.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    assert float(run.data.params["model.rho"]) == pytest.approx(1 / 7)
    assert run.data.params["global_batch_size"] == "16"
    history = c.get_metric_history(result.run_id, "loss")
    assert [m.step for m in history] == [1, 2] and all(np.isfinite(m.value) for m in history)
    assert {a.path for a in c.list_artifacts(result.run_id, "config")} == {"config/pretrain.yaml"}
    pictures = {a.path for a in c.list_artifacts(result.run_id, "pictures")}
    assert pictures == {"pictures/reconstruction_epoch0002.png", "pictures/token_errors.png"}
    assert {a.path for a in c.list_artifacts(result.run_id, "decoder")} == {"decoder/decoder.safetensors"}
    name, version = registry.resolve_version(result.encoder_uri)
    tags = c.get_model_version(name, version).tags
    assert tags["rho"] == str(1 / 7) and tags["dataset"] == "digits" and tags["run_id"] == result.run_id
    assert Path(result.checkpoint_path, "model.safetensors").exists()


def test_registered_encoder_reloads_identically_in_fresh_process(pretrained, workdir):
    cfg, result = pretrained
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    np.save(workdir / "x.npy", x.numpy())
    script = f"""
import numpy as np, torch, mlflow
from ropim.registry import load_encoder
enc, cfg = load_encoder({result.encoder_uri!r})
x = torch.from_numpy(np.load("x.npy"))
with torch.no_grad():
    np.save("feats.npy", enc(x).numpy())
np.save("pyfunc.npy", mlflow.pyfunc.load_model({result.encoder_uri!r}).predict(np.load("x.npy")))
"""
    env = {**os.environ, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    subprocess.run([sys.executable, "-c", script], cwd=workdir, env=env, check=True, capture_output=True)

    state = load_file(str(Path(result.checkpoint_path, "model.safetensors")))
    reference = create_encoder(TINY).eval()
    reference.load_state_dict({k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")})
    with torch.no_grad():
        expected = reference(x).numpy()
    assert expected.shape == (3, 192)
    np.testing.assert_array_equal(np.load(workdir / "feats.npy"), expected)
    np.testing.assert_allclose(np.load(workdir / "pyfunc.npy"), expected, rtol=0, atol=1e-6)


def test_finetune_from_registered_encoder_tags_the_version(pretrained):
    _, result = pretrained
    cfg = FinetuneConfig(encoder=result.encoder_uri, data=DataConfig(), epochs=1, batch_size=64, warmup_epochs=0,
                         mixup=0, cutmix=0)
    metrics = finetune(cfg)
    assert 0 <= metrics["top1"] <= metrics["top5"] <= 100
    c = registry.client()
    run = c.get_run(metrics["run_id"])
    name, version = registry.resolve_version(result.encoder_uri)
    assert run.data.tags["ropim.encoder_version"] == version and run.data.tags["ropim.encoder_name"] == name
    assert c.get_model_version(name, version).tags["downstream.digits.top1"] == f"{metrics['top1']:.2f}"


def test_missing_alias_and_version_are_clear_errors(pretrained):
    with pytest.raises(LookupError, match="no alias 'nope'"):
        registry.load_encoder("models:/ropim-encoder@nope")
    with pytest.raises(LookupError, match="no such registered version"):
        registry.load_encoder("models:/ropim-encoder/999")


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ropim.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.rho", "1.5"], "rho=1.5"),
        (["--model.rho", "0"], "rho=0"),
        (["--model.img_size", "30", "--model.patch_size", "4"], "patch size must divide"),
        (["--model.arch", "vit_giant_patch99"], "arch='vit_giant_patch99'"),
        (["--global_batch_size", "10", "--num_workers", "3"], "not divisible by num_workers=3"),
    ],
)
def test_bad_input_fails_before_ray_starts(args, message, tmp_path):
    proc = _cli("pretrain", "--preset", "digits_demo", *args, cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "Ray" not in proc.stdout + proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_unreachable_mlflow_server_fails_before_ray(tmp_path):
    proc = _cli("pretrain", "--preset", "digits_demo", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
                cwd=tmp_path)
    assert proc.returncode != 0
    assert "MLflow server unreachable" in proc.stderr and "http://127.0.0.1:9" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr


def test_cli_presets_and_config_resolution(tmp_path):
    listed = _cli("presets").stdout
    assert "pretrain/digits_demo" in listed and "demo/digits_demo" in listed
    proc = _cli("pretrain", "--preset", "digits_demo", "--model.rho", "0.25", "--print_config")
    printed = proc.stdout
    assert "rho: 0.25" in printed and "depth: 6" in printed
    user = tmp_path / "mine.yaml"
    user.write_text(json.dumps({"epochs": 3, "model": {"rho": 0.5}}))
    printed = _cli("pretrain", "--preset", "digits_demo", "--config", str(user), "--print_config").stdout
    assert "epochs: 3" in printed and "rho: 0.5" in printed and "depth: 6" in printed
    unknown = _cli("pretrain", "--preset", "nope")
    assert unknown.returncode != 0 and "unknown --preset 'nope'" in unknown.stderr
