"""ropim.checks: the CPU share that leaves Ray Data its CPU is the share the ray_data check accepts and names; every
config checks the fields its types declare (true/false, a named choice) and its named choices."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest

from ropim.checks import check_data_cpus, check_folder, check_location, data_cpu_share, waiting_note
from ropim.core.config import ModelConfig
from ropim.data.config import DataConfig, SegDataConfig
from ropim.errors import ConfigError
from ropim.flows.config import ProbeConfig, TransferConfig
from ropim.train.jobs import JOBS
from ropim.train.pretrain.config import PretrainConfig
from tune.config import SweepConfig


@pytest.mark.parametrize(("cpus", "workers", "share"), [(2, 2, 0.5), (2, 1, 1.0), (8, 2, 3.5), (8, 8, 0.87),
                                                         (3, 4, 0.5), (1, 1, 0.0), (16, 3, 5.0), (4, 2, 1.5)])
def test_the_share_is_the_largest_the_ray_data_check_accepts(cpus, workers, share):
    assert data_cpu_share(cpus, workers) == share
    if share:
        check_data_cpus(cpus, workers, share, "here")
        with pytest.raises(ConfigError, match=f"use --cpus_per_worker {share:g}"):
            check_data_cpus(cpus, workers, share + 0.01, "here")


CONFIGS = [*(job.config for job in JOBS.values()), ModelConfig, DataConfig, SegDataConfig, ProbeConfig,
           TransferConfig, SweepConfig]


def declared(cls: type) -> dict[str, tuple[object, str]]:
    """Field → (a wrong value, what the error must say) for the ``bool`` and ``Literal`` fields of ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: ("false", "true or false") if hints[f.name] is bool else
            ("nope", "one of " + ", ".join(typing.get_args(hints[f.name])))
            for f in dataclasses.fields(cls)
            if hints[f.name] is bool or typing.get_origin(hints[f.name]) is typing.Literal}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_true_false_and_named_choice_field_refuses_another_value(cls):
    """What a field's type declares is checked in every config, not only where a rule lists it: a ``bool`` field given
    "false" (truthy: a config built in code, a Tune space) and a ``Literal`` field given another name are one error
    naming the field."""
    base = cls(data="digits") if cls is TransferConfig else cls(pretrain={"epochs": 1}) if cls is SweepConfig else cls()
    fields = declared(cls)
    assert fields
    for name, (wrong, expected) in fields.items():
        with pytest.raises(ConfigError, match=re.escape(f"{name}={wrong!r}: ")) as err:
            dataclasses.replace(base, **{name: wrong}).validate()
        assert expected in str(err.value) or name == "format", err.value  # data format: its own wording (test_formats)


def test_named_choices_of_the_jobs_and_the_model_are_one_error_each():
    cases = {"precision": "fp64", "adamw": "apex", "placement_strategy": "spread"}
    for name, wrong in cases.items():
        with pytest.raises(ConfigError, match=re.escape(f"{name}={wrong!r}: must be one of")):
            dataclasses.replace(PretrainConfig(), **{name: wrong}).validate()
    with pytest.raises(ConfigError, match=re.escape("ingest='dask': must be one of torch, ray_data")):
        PretrainConfig(ingest="dask").validate()
    for name in ("arch", "backbone", "corruption", "loss", "hashing", "init"):
        with pytest.raises(ConfigError, match=re.escape(f"model.{name}='x': must be one of")):
            dataclasses.replace(ModelConfig(), **{name: "x"}).validate()
    with pytest.raises(ConfigError, match=re.escape("metric='loss': must be one of knn_top1")):
        SweepConfig(metric="loss", pretrain={"epochs": 1}).validate()


def test_workers_beyond_the_joined_cluster_as_it_is_now_are_named_once():
    assert waiting_note(4, 2.0, True, 16, 4, "c") is None  # they fit: no line
    note = waiting_note(8, 2.0, True, 16, 4, "the Ray cluster at h:6379")
    assert note.startswith("8 workers need 8 GPUs (4 now) of the Ray cluster at h:6379: waiting for nodes")
    assert "16 CPUs" not in note and "--num_workers" in note  # the CPUs fit; the fix named
    assert waiting_note(2, 1.0, False, 1, 0, "c").startswith("2 workers need 2 CPUs (1 now) of c")  # no GPU asked


def test_a_local_output_folder_given_as_a_uri_is_refused(tmp_path, monkeypatch):
    """``--out s3://b/results`` was the local folder ./s3:/b/results, written after hours of cells."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"--out 's3://b/results': a local folder is written here, not a URI"):
        check_folder("s3://b/results", "--out")
    assert not (tmp_path / "s3:").exists()


def test_a_storage_uri_with_query_parameters_is_refused_with_the_environment_to_use():
    with pytest.raises(ConfigError, match=r"storage_path=s3://b/runs\?endpoint_override=minio:9000: a storage URI may "
                                          r"not carry query parameters .* AWS_ENDPOINT_URL .*storage_path=s3://b/runs$"):
        check_location("s3://b/runs?endpoint_override=minio:9000", "storage_path")
    check_location("s3://b/shards?region=eu-west-1", "data.source")  # read, not joined onto
