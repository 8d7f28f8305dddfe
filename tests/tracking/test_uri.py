"""The tracking store's URI (``ropim.tracking.uri.tracking_uri``): one file wherever a job's workers and trials run."""

from __future__ import annotations

from ropim.tracking.uri import tracking_uri


def test_a_relative_sqlite_store_is_the_file_in_the_working_folder(tmp_path, monkeypatch):
    """``MLFLOW_TRACKING_URI=sqlite:///mlflow.db`` (MLflow's docs' form) was handed on as typed: the store's artifact
    folder could not be made a file URI, and Tune trials, run in folders of their own, would open a store there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")
    assert tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////srv/mlflow.db")  # absolute: as given
    assert tracking_uri() == "sqlite:////srv/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri() == "http://127.0.0.1:5000"
