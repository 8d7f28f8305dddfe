"""Fixtures shared by the test modules: a working directory with its own MLflow store, one Ray session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request):
    """A working directory with its own sqlite MLflow store, shared by the module."""
    d = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2].removeprefix("test_"))
    patch = pytest.MonkeyPatch()
    patch.chdir(d)
    patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{d / 'mlflow.db'}")
    yield d
    patch.undo()


@pytest.fixture(scope="module")
def ray_session(workdir):
    """One 2-CPU Ray session for the module, started in ``workdir`` (its workers inherit the folder and the MLflow
    store) with the dashboard, as ``ropim.runtime.ray_session`` starts it; yields its address, for fresh
    processes to join through RAY_ADDRESS."""
    import ray

    ray.init(num_cpus=2, include_dashboard=True, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
