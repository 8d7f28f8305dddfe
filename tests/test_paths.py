"""Paths mean what the user typed: a relative data path (through a symbolic link) pretrains on 2 Ray workers, which
run in another folder; ``~`` and relative paths are resolved once, on the driver, and stored resolved, so a resumed
run finds them; URIs and keywords are left alone; a local path on a multi-node cluster gets one note."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support import run_cli_in_one_process, tiny_pretrain

from ropim.commands import config
from ropim.data.config import DataConfig
from ropim.paths import cluster_note, resolve_path
from ropim.tracking import registry, store
from ropim.train.driver import run


def image_folder(root: Path, per_class: int = 24) -> Path:
    """A two-class ImageFolder of small random PNGs."""
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_resolve_path_joins_the_working_folder_expands_home_and_keeps_links(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert resolve_path("link/x") == str(tmp_path / "link" / "x")  # through the link, not its target
    assert resolve_path("../up") == str(tmp_path.parent / "up")
    assert resolve_path("~/data") == str(tmp_path / "home" / "data")
    assert resolve_path("shards/*.parquet") == str(tmp_path / "shards" / "*.parquet")
    for kept in ("s3://bucket/x", "gs://b/y", "s3://b/x?region=eu-west-1", "models:/ropim-encoder@champion",
                 "runs:/abc/encoder", "/abs/path", "", None):
        assert resolve_path(kept) == kept
    assert resolve_path("digits", ("digits",)) == "digits"


def test_storage_uris_take_the_names_joined_onto_them(tmp_path):
    """``s3://b/runs/`` (as copied from a console) would give ``s3://b/runs//NAME``, which pyarrow refuses at the first
    checkpoint; ``file:///PATH`` is the local folder, with its lock and disk check."""
    assert resolve_path("s3://b/runs/") == "s3://b/runs"
    assert resolve_path("s3://b//runs///x/") == "s3://b/runs/x"
    assert resolve_path("s3://b/") == "s3://b"
    assert resolve_path(f"file://{tmp_path}/runs/") == str(tmp_path / "runs")
    assert resolve_path("s3://b/shards/*.parquet") == "s3://b/shards/*.parquet"


def test_cluster_note_names_local_paths_only_on_several_nodes():
    paths = {"data.source": "/data/imgs", "storage_path": "s3://b/runs", "encoder": "models:/e/1"}
    assert cluster_note(paths, nodes=1) is None
    assert cluster_note({"data.source": "digits", "storage_path": "s3://b/r"}, nodes=3) is None
    note = cluster_note(paths, nodes=3)
    assert "3 nodes" in note and "data.source=/data/imgs is a local path" in note and "s3://b/runs" not in note


def test_a_ray_job_keeping_checkpoints_in_its_working_folder_copy_says_so_and_how_to_continue(tmp_path, monkeypatch):
    from ropim.paths import job_copy_note
    from ropim.train.jobs import JOBS, Prepared

    monkeypatch.chdir(tmp_path)  # Ray's unpacked copy of the submitted folder, where the driver runs
    cfg = tiny_pretrain(run_name="long").resolved()
    assert job_copy_note(cfg.storage_path) is None  # not a Ray job: nothing to say
    assert Prepared(JOBS["pretrain"], cfg, "").resume_hint == "ropim pretrain --resume long"
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_1.zip"},
                                                                  "metadata": {}}))
    note = job_copy_note(cfg.storage_path)
    assert note.startswith(f"note: storage_path={tmp_path}/ray_results lies inside Ray's copy of the submitted")
    assert job_copy_note(str(tmp_path.parent / "elsewhere")) is None and job_copy_note("s3://b/runs") is None
    assert job_copy_note(f"{tmp_path}/transfer_results", "out").startswith(  # a transfer's tables: removed with it
        f"note: out={tmp_path}/transfer_results lies inside Ray's copy of the submitted working folder, which Ray")
    assert Prepared(JOBS["pretrain"], cfg, "").resume_hint == \
        "ray job submit --working-dir . -- python jobs/pretrain.py --resume long"


@pytest.mark.slow  # make test pretrains on two Ray workers elsewhere
def test_relative_data_path_through_a_link_pretrains_on_two_ray_workers(workdir, ray_session):
    image_folder(workdir / "imgs")
    os.symlink("imgs", workdir / "link")  # a relative link, read by workers that run in another folder
    cfg = tiny_pretrain(run_name="relative", num_workers=2, epochs=1, max_steps_per_epoch=2,
                        data=DataConfig(source="link"), storage_path="runs")
    result = run(cfg)
    assert result.model_uri is not None and result.metrics["epoch"] == 1
    meta = json.loads((workdir / "runs" / "relative" / "ropim_run.json").read_text())
    assert meta["config"]["data"]["source"] == str(workdir / "link")  # stored resolved, the link kept
    assert meta["config"]["storage_path"] == str(workdir / "runs")
    name, version = registry.resolve_version(result.model_uri)
    assert store.client().get_model_version(name, version).tags["dataset"] == str(workdir / "link")


def test_cli_relative_and_home_paths_in_process_resume_from_the_same_folder(workdir):
    image_folder(workdir / "home" / "pics")
    flags = ("pretrain", "--preset", "digits_demo", "--num_workers", "0", "--model.depth", "1", "--epochs", "2",
             "--global_batch_size", "16", "--max_steps_per_epoch", "2", "--viz_every", "0", "--eval_every", "0",
             "--data.source", "~/pics", "--storage_path", "my-runs", "--run_name", "home")
    # the first stops after epoch 1; the same command then continues the run (one process: one interpreter start)
    both = run_cli_in_one_process([[*flags, "--stop_after_epochs", "1"], list(flags)], (), cwd=workdir,
                                  env={"HOME": str(workdir / "home")})
    assert both.returncode == 0 and "EXIT" not in both.stdout, both.stderr[-2000:]
    _, second = both.stdout.split("unfinished: ")  # second: from the first command's resume hint on
    assert "ropim pretrain --resume home" in second.splitlines()[0]
    stored = json.loads((workdir / "my-runs" / "home" / "ropim_run.json").read_text())["config"]
    assert stored["data"]["source"] == str(workdir / "home" / "pics")
    assert "resumed from epoch 1" in second + both.stderr and "models:/ropim-encoder/" in second


def test_paths_in_a_config_file_mean_the_working_folder_not_the_file_folder(workdir):
    from ropim.cli import build_parser
    from ropim.train.pretrain.config import PretrainConfig

    (workdir / "cfgs").mkdir(exist_ok=True)
    (workdir / "cfgs" / "c.yaml").write_text("storage_path: out\ndata:\n  source: imgs\n")
    parser, _ = build_parser()
    ns = parser.instantiate(parser.parse_args(["pretrain", "--config", "cfgs/c.yaml"]))["pretrain"]
    cfg = config(ns, PretrainConfig).resolved()
    assert (cfg.data.source, cfg.storage_path) == (str(workdir / "imgs"), str(workdir / "out"))
