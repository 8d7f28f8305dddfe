"""One registered model holds one kind: a job whose ``--registered_model`` names a model holding versions of another
kind (an encoder into classifiers, a classifier into encoders, a segmenter into either) is refused in pre-flight in
one line, before Ray or training; a version of another kind that appears while a job trains is found again at
registration, where nothing is registered and the line names the command that registers the kept weights."""

from __future__ import annotations

import re

import pytest
from support import encoder_folder, run_cli_here, tiny_pretrain

from ropim.core.config import ModelConfig
from ropim.errors import ConfigError
from ropim.tracking import store
from ropim.train.driver import run
from ropim.train.jobs import prepare

TINY_PRETRAIN = ["--preset", "digits_demo", "--num_workers", "0", "--model.depth", "1", "--epochs", "1",
                 "--global_batch_size", "16", "--max_steps_per_epoch", "1", "--viz_every", "0"]


def holding(name: str, kind: str | None, versions: int = 1) -> None:
    """Registered model ``name`` with ``versions`` bare versions tagged ``kind`` (None: no kind tag, the older
    layout; 0 versions: the model alone)."""
    c = store.client()
    c.create_registered_model(name)
    for _ in range(versions):
        c.create_model_version(name, "file:///nowhere", tags={"kind": kind} if kind else {})


@pytest.fixture(scope="module")
def models(workdir):
    """The store of the module: classifiers in ``ropim-classifier``, encoders in ``ropim-encoder``, a segmenter in
    ``ropim-segmenter``, a model with no versions, one of the older layout (no kind tags); a local encoder."""
    holding("ropim-classifier", "classifier", 2)
    holding("ropim-encoder", "encoder")
    holding("ropim-segmenter", "segmenter")
    holding("no-versions", None, 0)
    holding("older-layout", None, 2)
    encoder_folder(workdir / "enc", ModelConfig(img_size=32, patch_size=8, depth=1))
    return workdir


def refused(workdir, *argv: str) -> str:
    """``ropim ARGV`` as typed in ``workdir``: it must fail in one line, before any run or Ray; that line."""
    runs = sorted(p.name for p in (workdir / "ray_results").glob("*")) if (workdir / "ray_results").exists() else []
    proc = run_cli_here(*argv, cwd=workdir)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Ray" not in proc.stdout and "[run]" not in proc.stdout, proc.stdout
    assert (sorted(p.name for p in (workdir / "ray_results").glob("*"))
            if (workdir / "ray_results").exists() else []) == runs  # no run folder made
    return lines[0]


def test_each_job_is_refused_a_registered_model_of_another_kind_in_one_line(models):
    line = refused(models, "pretrain", *TINY_PRETRAIN, "--registered_model", "ropim-classifier")
    assert line == ("ropim pretrain: registered_model=ropim-classifier holds classifiers (v1, v2): one registered "
                    "model holds one kind; give the encoder another --registered_model (e.g. ropim-encoder), or "
                    "--registered_model \"\" to register nothing")
    line = refused(models, "finetune", "--preset", "digits_demo", "--encoder", "enc", "--num_workers", "0",
                   "--registered_model", "ropim-encoder")
    assert "registered_model=ropim-encoder holds encoders (v1): " in line
    assert "give the classifier another --registered_model (e.g. ropim-classifier)" in line
    for other in ("ropim-encoder", "ropim-classifier"):
        line = refused(models, "segment", "--preset", "digits_seg", "--encoder", "enc", "--num_workers", "0",
                       "--registered_model", other)
        assert f"registered_model={other} holds " in line and "give the segmenter another" in line, line
    line = refused(models, "graft", "--preset", "digits_demo", "--encoder", "enc", "--num_workers", "0",
                   "--registered_model", "ropim-segmenter")
    assert "registered_model=ropim-segmenter holds segmenters (v1): " in line and "give the encoder" in line
    line = refused(models, "sweep", "--preset", "rho_ablation", "--registered_model", "ropim-classifier")
    assert "registered_model=ropim-classifier holds classifiers (v1, v2): " in line and "give the encoder" in line
    # nothing was created on the way: no version, no MLflow run
    c = store.client()
    assert len(c.search_model_versions("name='ropim-classifier'")) == 2
    assert [e.name for e in c.search_experiments()] == ["Default"]


def test_a_model_without_versions_or_kind_tags_or_of_the_same_kind_is_accepted(models):
    for name in ("no-versions", "older-layout", "ropim-encoder", "a-new-model", ""):
        assert prepare(tiny_pretrain(num_workers=0, registered_model=name)).cfg.registered_model == name


def test_a_version_of_another_kind_appearing_during_training_registers_nothing_and_keeps_the_weights(models, caplog):
    """The pre-flight passed; a classifier is registered into the same model while the run trains: the run ends in
    one line, no encoder version is added to the classifiers, and the command that line names registers the trained
    encoder without training it again."""
    prepared = prepare(tiny_pretrain(num_workers=0, epochs=1, max_steps_per_epoch=1, run_name="late",
                                     registered_model="late-model"))
    holding("late-model", "classifier")  # as if another job registered it meanwhile
    with pytest.raises(ConfigError) as err:
        run(prepared)
    line = str(err.value)
    assert line.startswith("registered_model=late-model holds classifiers (v1), which appeared after the pre-flight "
                           "(one registered model holds one kind): nothing registered; run late keeps its trained "
                           "encoder ("), line
    c = store.client()
    assert [v.tags.get("kind") for v in c.search_model_versions("name='late-model'")] == ["classifier"]
    command = re.search(r"register it with `ropim (.+)`$", line).group(1).split()
    assert command == ["pretrain", "--resume", "late", "--registered_model", "ropim-encoder"]
    caplog.clear()
    proc = run_cli_here(*command, cwd=models)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed from epoch 1" in caplog.text and "epoch 1/1 loss" not in caplog.text  # not trained again
    uri = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"models:/ropim-encoder/2", uri), proc.stdout[-2000:]
    assert c.get_model_version("ropim-encoder", "2").tags["kind"] == "encoder"
