"""Jobs that share a store do not break each other: three pretraining jobs started at once on one fresh sqlite store
all finish and register (the store is created and migrated once, under a lock), and a busy store is retried."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import ROOT

from ropim.tracking import store

TINY_JOB = ("pretrain", "--preset", "digits_demo", "--num_workers", "0", "--model.depth", "1", "--epochs", "1",
            "--global_batch_size", "16", "--max_steps_per_epoch", "1", "--viz_every", "0", "--eval_every", "0")


@pytest.mark.faults
def test_three_jobs_started_at_once_on_a_fresh_sqlite_store_all_register(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    jobs = [subprocess.Popen([sys.executable, "-m", "ropim.cli", *TINY_JOB, "--run_name", f"job{i}"], cwd=tmp_path,
                             env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for i in range(3)]
    outputs = [job.communicate(timeout=600) for job in jobs]
    for job, (out, err) in zip(jobs, outputs, strict=True):
        assert job.returncode == 0, err[-3000:]
        assert "registered encoder models:/ropim-encoder/" in out
    c = store.client(uri)
    versions = c.search_model_versions("name='ropim-encoder'")
    assert sorted(int(v.version) for v in versions) == [1, 2, 3]
    runs = c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["job0", "job1", "job2"]
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_busy_store_is_retried_with_backoff_and_other_errors_are_not(monkeypatch):
    waits = []
    monkeypatch.setattr(store.time, "sleep", waits.append)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return "done"

    assert store.retrying(flaky)() == "done" and len(calls) == 3
    assert len(waits) == 2 and 0.1 <= waits[0] <= 0.3 and 0.2 <= waits[1] <= 0.6  # 0.2 s, then 0.4 s, ± half

    def broken():
        calls.append(1)
        raise ValueError("no such table")

    calls.clear()
    with pytest.raises(ValueError, match="no such table"):
        store.retrying(broken)()
    assert len(calls) == 1
