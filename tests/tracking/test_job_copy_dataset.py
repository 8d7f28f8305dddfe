"""A relative data path under ``ray job submit --working-dir .`` is one data set, whatever copy of the folder Ray
unpacked for the job: MLflow records it as ``working_dir:<path>`` (the run's parameter, the version's ``dataset`` and
``metric_dataset`` tags), and the champion rule compares two submissions' encoders on it. Without a Ray job: the
variable Ray sets for a job's driver, and two folders named as Ray names its copies."""

from __future__ import annotations

import json

import pytest
from support import tiny_pretrain

from ropim.data.config import DataConfig
from ropim.tracking import registry, store
from ropim.tracking.champion import dataset_alias, promote_champion
from tune.outcome import dataset_key

JOB_ENV = json.dumps({"runtime_env": {"working_dir": "."}})


def job_copy(root, digest: str):
    """A folder where Ray unpacks a submitted working folder, holding ``data/digits``."""
    copy = root / "session_x" / "runtime_resources" / "working_dir_files" / f"_ray_pkg_{digest}"
    (copy / "data" / "digits").mkdir(parents=True)
    return copy


def submitted(monkeypatch, copy, name: str, version: str) -> tuple[str, dict]:
    """What a job submitted with ``--data.source data/digits`` records when Ray runs it in ``copy``: its run's
    ``data.source`` parameter and the tags of its version ``version`` of ``name`` once the champion rule ran, with the
    data set as a sweep hands it over (``dataset_key``)."""
    monkeypatch.chdir(copy)
    cfg = tiny_pretrain(data=DataConfig(source="data/digits")).resolved()  # the path as the driver resolves it
    assert cfg.data.source == str(copy / "data" / "digits")
    run_id = store.create_run("ropim-pretrain", f"in-{copy.name}", cfg.to_dict())
    promote_champion(name, version, "knn_top1@k=20", dataset_key(cfg.to_dict()["data"]), 50.0 + int(version))
    param = store.client().get_run(run_id).data.params["data.source"]
    return param, store.client().get_model_version(name, version).tags


def test_two_submissions_of_the_same_relative_folder_are_one_data_set(workdir, tmp_path, monkeypatch):
    c, name = store.client(), "job-copy-test"
    c.create_registered_model(name)
    v1, v2 = (str(c.create_model_version(name, "file:///nowhere").version) for _ in range(2))
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", JOB_ENV)
    param1, tags1 = submitted(monkeypatch, job_copy(tmp_path, "1a2b"), name, v1)
    param2, tags2 = submitted(monkeypatch, job_copy(tmp_path, "3c4d"), name, v2)
    assert param1 == param2 == "working_dir:data/digits"
    assert tags1["metric_dataset"] == tags2["metric_dataset"] == "working_dir:data/digits"
    # the second submission's better encoder is compared with the first one's, on the same data set
    assert tags2["alias.champion"] == "moved here: knn_top1@k=20 52 beats v1's 51 on working_dir:data/digits"
    per_dataset = dataset_alias("working_dir:data/digits")
    assert per_dataset.startswith("champion-digits-")
    assert str(c.get_model_version_by_alias(name, per_dataset).version) == v2
    assert not [a for a in c.get_registered_model(name).aliases if a.startswith("champion-") and a != per_dataset]


def test_a_version_scored_in_an_earlier_copy_is_compared_on_the_same_data_set(workdir, tmp_path, monkeypatch):
    """A version whose ``metric_dataset`` holds a copy's path (recorded before this rule) is read as the same data."""
    c, name = store.client(), "job-copy-before"
    c.create_registered_model(name)
    v1, v2 = (str(c.create_model_version(name, "file:///nowhere").version) for _ in range(2))
    old = job_copy(tmp_path, "99ff")
    c.set_model_version_tag(name, v1, "metric", "knn_top1@k=20")
    c.set_model_version_tag(name, v1, "metric_dataset", str(old / "data" / "digits"))
    c.set_model_version_tag(name, v1, "metric_value", "60.0")
    c.set_registered_model_alias(name, "champion", v1)
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", JOB_ENV)
    _, tags = submitted(monkeypatch, job_copy(tmp_path, "5e6f"), name, v2)
    assert tags["alias.champion"] == "not moved: knn_top1@k=20 52 does not beat v1's 60 on working_dir:data/digits"


@pytest.mark.parametrize("location", ["digits", "s3://bucket/imgs", "/data/imgs", "/data/imgs?val_fraction=0.2"])
def test_other_locations_are_recorded_as_they_are(location, tmp_path, monkeypatch):
    from ropim.paths import recorded_location

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", JOB_ENV)
    monkeypatch.chdir(tmp_path)
    assert recorded_location(location) == location
    assert recorded_location(f"{tmp_path}/imgs?val_fraction=0.2") == "working_dir:imgs?val_fraction=0.2"
    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR")
    assert recorded_location(f"{tmp_path}/imgs") == f"{tmp_path}/imgs"  # not a Ray job: the path itself


def test_a_registered_encoders_dataset_tag_is_the_recorded_data_set(workdir, tmp_path, monkeypatch):
    """The ``dataset`` tag of a version (its card, ``ropim models list``) is the same in every copy."""
    import torch

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", JOB_ENV)
    monkeypatch.chdir(job_copy(tmp_path, "7a8b"))
    config = {"arch": "test", "timm_kwargs": {"img_size": 8}, "img_size": 8, "embed_dim": 2,
              "dataset": DataConfig(source="data/digits").resolved().source}
    run_id = store.create_run("ropim-pretrain", "tag-test", {})
    uri = registry.register_encoder(run_id, {"w": torch.zeros(2)}, config, "job-copy-tag")
    assert store.client().get_model_version("job-copy-tag", uri.rsplit("/", 1)[1]).tags["dataset"] == \
        "working_dir:data/digits"
