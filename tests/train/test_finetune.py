"""Downstream jobs on CPU: fine-tune on Ray Train from a registered encoder in a fresh process, in-process
stop/resume, linear probe + kNN, resolution change, classifier reload without pickle, transfer table, bad input."""

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
from safetensors.torch import load_file, save_file

from ropim import registry
from ropim.data import DataConfig, build_dataset
from ropim.downstream import build_model
from ropim.errors import ConfigError
from ropim.evaluate import (
    FinetuneConfig,
    ProbeConfig,
    TransferConfig,
    finetune,
    knn_probe,
    knn_top1,
    linear_probe,
    probe,
    transfer,
)
from ropim.model import ModelConfig, create_encoder
from ropim.train import PretrainConfig, encoder_config

TINY = ModelConfig(img_size=32, patch_size=4, depth=1)
QUICK = dict(epochs=2, batch_size=16, max_steps_per_epoch=2, warmup_epochs=0, log_every=1)


def _encoder_folder(path: Path, model: ModelConfig, seed: int = 0) -> Path:
    """A local encoder folder (encoder.safetensors + config.json), as registered encoders hold."""
    torch.manual_seed(seed)
    enc = create_encoder(model)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in enc.state_dict().items()}, str(path / "encoder.safetensors"))
    (path / "config.json").write_text(json.dumps(encoder_config(PretrainConfig(model=model), enc.embed_dim)))
    return path


@pytest.fixture(scope="module")
def encoder(workdir):
    """A tiny encoder registered as ropim-encoder v1 with alias 'champion'; also kept as a local folder."""
    folder = _encoder_folder(workdir / "enc-local", TINY)
    state, config = load_file(str(folder / "encoder.safetensors")), json.loads((folder / "config.json").read_text())
    run_id = registry.create_run("ropim-pretrain", "tiny", PretrainConfig(model=TINY).to_dict())
    uri = registry.register_encoder(run_id, state, config)
    registry.end_run(run_id)
    registry.client().set_registered_model_alias("ropim-encoder", "champion", "1")
    return uri, folder


def _run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ropim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout)


# ------------------------------------------------------------------------------------ probe / kNN on toy features


def _toy(n_classes=10, dim=32, per_class=(40, 20), seed=0, spread=4.0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(n_classes, dim, generator=g) * spread
    out = []
    for n in per_class:
        y = torch.arange(n_classes).repeat_interleave(n)
        out += [centers[y] + torch.randn(len(y), dim, generator=g), y]
    return out  # train_x, train_y, val_x, val_y


def test_probe_and_knn_separate_a_separable_toy_set():
    train_x, train_y, val_x, val_y = _toy()
    lin = linear_probe(train_x, train_y, val_x, val_y, epochs=30)
    knn = knn_probe(train_x, train_y, val_x, val_y, k=10)
    assert lin["top1"] > 95 and knn["top1"] > 95
    assert lin["top5"] >= lin["top1"] and knn["top5"] >= knn["top1"]
    assert lin["scores"].shape == knn["scores"].shape == (200, 10)
    assert knn_top1(train_x, train_y, val_x, val_y, k=10) == pytest.approx(knn["top1"])


def test_probe_and_knn_are_at_chance_on_shuffled_labels():
    train_x, train_y, val_x, val_y = _toy(per_class=(60, 50))
    g = torch.Generator().manual_seed(1)
    train_y, val_y = train_y[torch.randperm(len(train_y), generator=g)], val_y[torch.randperm(len(val_y), generator=g)]
    lin = linear_probe(train_x, train_y, val_x, val_y, epochs=30)
    knn = knn_probe(train_x, train_y, val_x, val_y, k=20)
    for r in (lin, knn):  # chance: 10% top-1, 50% top-5; 500 val points, so ± ~3 points is one std of top-5
        assert 3 < r["top1"] < 20 and 38 < r["top5"] < 62, r


# ------------------------------------------------------------------------------------ resolution


def test_resolution_change_resamples_position_embedding_and_logs(caplog):
    from timm.layers import resample_abs_pos_embed

    torch.manual_seed(0)
    enc = create_encoder(TINY)
    config = encoder_config(PretrainConfig(model=TINY), enc.embed_dim)
    with caplog.at_level(logging.INFO, logger="ropim"):
        same = build_model(config, enc.state_dict(), 10, 32, uri="enc-a")
        assert "resampled" not in caplog.text
        bigger = build_model(config, enc.state_dict(), 10, 48, uri="enc-a")
    assert "enc-a was pretrained at 32x32, used at 48x48" in caplog.text
    assert "from a 8x8 to a 12x12 grid" in caplog.text
    assert torch.equal(same.pos_embed, enc.pos_embed)
    assert bigger.pos_embed.shape == (1, 1 + 12 * 12, enc.embed_dim)
    expected = resample_abs_pos_embed(enc.pos_embed, new_size=[12, 12], old_size=[8, 8], num_prefix_tokens=1)
    assert torch.equal(bigger.pos_embed.data, expected)
    assert torch.equal(bigger.blocks[0].attn.qkv.weight, enc.blocks[0].attn.qkv.weight)
    with torch.no_grad():
        assert bigger(torch.randn(2, 3, 48, 48)).shape == (2, 10)


# ------------------------------------------------------------------------------------ fine-tune on Ray Train


@pytest.fixture(scope="module")
def ray_finetune(workdir, ray_session, encoder):
    """`ropim finetune` in a fresh process, 2 Ray Train workers, encoder given by alias."""
    proc = _run_cli("finetune", "--encoder", "models:/ropim-encoder@champion", "--data", "digits",
                    "--num_workers", "2", "--run_name", "ft-ray", *[f"--{k}={v}" for k, v in QUICK.items()],
                    cwd=workdir, env={"RAY_ADDRESS": ray_session})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_finetune_from_registered_encoder_in_fresh_process_on_ray_train(ray_finetune, workdir):
    assert "[finetune] run ft-ray on 2 Ray Train workers: ropim-encoder v1 on digits" in ray_finetune.stdout
    assert "top-1" in ray_finetune.stdout.splitlines()[-1]
    c = registry.client()
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
    done = [p.parent for p in run_dir.rglob("eval.json") if json.loads(p.read_text())["epoch"] == QUICK["epochs"]]
    assert len(done) == 1, done
    return done[0]


def test_classifier_reloads_without_pickle_and_predicts_identically(ray_finetune, workdir):
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    np.save(workdir / "cls_x.npy", x.numpy())
    script = """
import numpy as np, torch, mlflow
from ropim.registry import load_classifier
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
    reference = build_model(config, None, 10).eval()
    reference.load_state_dict(load_file(str(final / "model.safetensors")))
    with torch.no_grad():
        expected = reference(x).numpy()
    np.testing.assert_array_equal(np.load(workdir / "cls_logits.npy"), expected)
    np.testing.assert_allclose(np.load(workdir / "cls_pyfunc.npy"), expected, rtol=0, atol=1e-5)


# ------------------------------------------------------------------------------------ in-process, resume


def test_in_process_stop_and_resume_matches_uninterrupted(workdir, encoder):
    uri, _ = encoder
    cfg = FinetuneConfig(encoder=uri, num_workers=0, registered_model="", **QUICK)
    straight = finetune(dataclasses.replace(cfg, run_name="local-straight"))
    first = finetune(dataclasses.replace(cfg, run_name="local-resume", stop_after_epochs=1))
    c = registry.client()
    assert first["epoch"] == 1 and first["step"] == 2 and c.get_run(first["run_id"]).info.status == "KILLED"
    resumed = finetune(dataclasses.replace(cfg, run_name="local-resume"))
    assert resumed["run_id"] == first["run_id"] and resumed["epoch"] == 2 and resumed["step"] == 4
    assert c.get_run(resumed["run_id"]).info.status == "FINISHED"
    assert resumed["top1"] == pytest.approx(straight["top1"]) and resumed["top5"] == pytest.approx(straight["top5"])
    assert resumed["train_loss"] == pytest.approx(straight["train_loss"], rel=1e-5)
    assert resumed["classifier_uri"] is None  # registered_model="" keeps the registry clean
    again = finetune(dataclasses.replace(cfg, run_name="local-resume"))  # finished: reported, not re-trained
    assert again["run_id"] == resumed["run_id"] and again["top1"] == pytest.approx(resumed["top1"])
    assert [m.step for m in c.get_metric_history(resumed["run_id"], "top1")] == [1, 2]
    with pytest.raises(ConfigError, match="already exists .* different config .*base_lr"):
        finetune(dataclasses.replace(cfg, run_name="local-resume", base_lr=0.5))


# ------------------------------------------------------------------------------------ probe end to end, transfer


def test_probe_at_another_resolution_logs_and_tags(workdir, encoder, caplog):
    uri, _ = encoder
    with caplog.at_level(logging.INFO, logger="ropim"):
        res = probe(ProbeConfig(encoder=uri, img_size=48, linear_epochs=20, cache_dir=str(workdir / "feats")))
    assert "from a 8x8 to a 12x12 grid" in caplog.text
    assert res["linear"]["top1"] > 25 and res["knn"]["top1"] > 25  # 10 classes: chance is 10
    c = registry.client()
    tags = c.get_model_version("ropim-encoder", "1").tags
    assert tags["downstream.digits.linear_top1"] == f"{res['linear']['top1']:.2f}"
    assert tags["downstream.digits.knn_top1"] == f"{res['knn']['top1']:.2f}"
    assert {"linear_confusion.png", "knn_confusion.png"} <= {a.path for a in c.list_artifacts(res["run_id"])}
    assert len(list((workdir / "feats").glob("features-*.safetensors"))) == 1
    again = probe(ProbeConfig(encoder=uri, img_size=48, linear_epochs=20, cache_dir=str(workdir / "feats")))
    assert again["linear"]["top1"] == res["linear"]["top1"]  # same cached features, same seeded probe


def test_transfer_table_over_encoders(workdir, encoder):
    uri, folder = encoder
    other = _encoder_folder(workdir / "enc-other", TINY, seed=1)
    out = workdir / "transfer"
    res = transfer(TransferConfig(encoders=f"{uri},{other}", data="digits", mode="probe",
                                  probe=ProbeConfig(linear_epochs=10), out=str(out)))
    assert [r["encoder_label"] for r in res["rows"]] == ["ropim-encoder v1", str(other)]
    md = (out / "transfer.md").read_text()
    assert "| encoder | digits | mean |" in md and "| ropim-encoder v1 |" in md and "kNN (k=20)" in md
    rows = (out / "transfer.csv").read_text().strip().splitlines()
    assert rows[0] == "encoder,digits,mean" and len(rows) == 3
    assert len(json.loads((out / "transfer.json").read_text())["rows"]) == 2
    c = registry.client()
    n_runs = len(c.search_runs([c.get_experiment_by_name("ropim-probe").experiment_id]))
    with pytest.raises(LookupError, match="no alias 'nope'"):  # the bad second encoder stops it before any run
        transfer(TransferConfig(encoders=f"{uri},models:/ropim-encoder@nope", data="digits", mode="probe"))
    assert len(c.search_runs([c.get_experiment_by_name("ropim-probe").experiment_id])) == n_runs


# ------------------------------------------------------------------------------------ bad input


def test_wrong_uri_missing_alias_and_channel_mismatch_are_one_clear_error(workdir, encoder):
    c = registry.client()
    before = len(c.search_runs([e.experiment_id for e in c.search_experiments()]))
    gray = _encoder_folder(workdir / "enc-gray", dataclasses.replace(TINY, in_chans=1))
    cases = [
        ("models:/ropim-encoder@nope", LookupError, "no alias 'nope'"),
        ("models:/ropim-encoder/99", LookupError, "no such registered version"),
        ("models:/no-such-model/1", LookupError, "no such registered version"),
        ("runs:/0123456789abcdef/encoder", LookupError, "no MLflow run '0123456789abcdef'"),
        (str(workdir / "no-such-folder"), FileNotFoundError, "no such local folder"),
        (str(gray), ConfigError, "expects 1-channel images (in_chans=1) but data source='digits' gives 3-channel"),
    ]
    for uri, err, message in cases:
        with pytest.raises(err, match=message.replace("(", r"\(").replace(")", r"\)")):
            finetune(FinetuneConfig(encoder=uri, num_workers=2, **QUICK))
    with pytest.raises(ConfigError, match="expects 1-channel"):
        probe(ProbeConfig(encoder=str(gray)))
    assert len(c.search_runs([e.experiment_id for e in c.search_experiments()])) == before  # nothing started


@pytest.mark.parametrize(("command", "encoder_arg", "message"), [
    ("finetune", "models:/ropim-encoder@nope", "ropim finetune: encoder models:/ropim-encoder@nope: no alias 'nope'"),
    ("probe", "enc-gray", "expects 1-channel images"),
])
def test_cli_bad_encoder_is_one_line_before_ray(workdir, encoder, command, encoder_arg, message):
    if encoder_arg == "enc-gray":
        _encoder_folder(workdir / "enc-gray", dataclasses.replace(TINY, in_chans=1))
    proc = _run_cli(command, "--encoder", encoder_arg, "--data", "digits", cwd=workdir, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "Started a local Ray instance" not in proc.stderr
