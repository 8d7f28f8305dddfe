"""A run's lock on remote storage (``acquire_remote``; here a ``file://`` URI, the same pyarrow calls as ``s3://``):
the pre-flight's check and the lock read a holder the same way, and a half-written lock is stale, not a crash."""

from __future__ import annotations

import json
import os

import pytest

from ropim.tracking.lock import LOCK, RunInUse, acquire, check_free, owner, release


def test_remote_lock_is_taken_refused_while_held_and_taken_over_when_stale(tmp_path):
    storage = f"file://{tmp_path}"
    lock = acquire(storage, "r")
    assert json.loads((tmp_path / "r" / LOCK).read_text())["pid"] == os.getpid()
    with pytest.raises(RunInUse, match=rf"run_name='r' is in use by another job \(pid {os.getpid()} on "):
        check_free(storage, "r")
    with pytest.raises(RunInUse, match="is in use by another job"):
        acquire(storage, "r")
    release(lock)
    check_free(storage, "r")
    (tmp_path / "r" / LOCK).write_text('{"host": ')  # a writer killed mid-write
    check_free(storage, "r")  # stale, as for a local lock
    release(acquire(storage, "r"))  # before: json.JSONDecodeError from acquire_remote
    (tmp_path / "r" / LOCK).write_text(json.dumps({**owner(), "pid": 2 ** 22 + 7, "started": "1"}))  # gone
    release(acquire(storage, "r"))
    assert not (tmp_path / "r" / LOCK).exists()
