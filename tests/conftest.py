"""Fixtures several test modules share: a working directory with its own MLflow store, one Ray session for the
whole test run. Tiny configs and builders are in ``support.py``."""

from __future__ import annotations

import os

import pytest

# Ray Train's controller polls its workers every 2 s; a tiny test run ends, fails or restarts that much later. Tests
# poll every 0.1 s (Ray hands the variable on to the controller). The preemption watcher (cloud spot-instance
# notices) is one more actor per run, with nothing to watch on this machine.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory):
    """An empty sqlite MLflow store, its tables created and migrated once for the whole test run (a second each);
    the jobs that create a store themselves are tested where that matters (test_shared_store, the bad-input
    catalogue, the CLI tests in fresh folders)."""
    from ropim.tracking.store import prepare_store

    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    prepare_store(f"sqlite:///{db}")
    return db


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, request, empty_store):
    """A working directory with its own sqlite MLflow store (a copy of ``empty_store``), shared by the module."""
    import shutil

    d = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2].removeprefix("test_"))
    shutil.copyfile(empty_store, d / "mlflow.db")
    patch = pytest.MonkeyPatch()
    patch.chdir(d)
    patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{d / 'mlflow.db'}")
    yield d
    patch.undo()


@pytest.fixture(scope="session")
def ray_session():
    """One 2-CPU Ray session for the whole test run, with the dashboard and workers at the driver's priority (as
    ``ropim.train.runtime.ray_session`` starts it); yields its address, for fresh processes to join through
    RAY_ADDRESS. Jobs hand their workers the tracking URI and absolute paths, so one session serves every module's
    working directory."""
    import ray

    from ropim.train.niceness import even_worker_priority

    even_worker_priority()
    ray.init(num_cpus=2, include_dashboard=True, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
