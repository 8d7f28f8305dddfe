"""A run's lock on remote storage (``acquire_remote``; here a ``file://`` URI, the same pyarrow calls as ``s3://``):
the pre-flight's check and the lock read a holder the same way, and a half-written lock is stale, not a crash."""

from __future__ import annotations

import json
import os

import pytest

from ropim.tracking.lock import GUARD, LOCK, RunInUse, acquire, check_free, owner, release


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


def contend(storage: str, barrier, results) -> None:
    """Take run ``r``'s lock as the others try at the same instant; hold it a moment; say whether it was ours."""
    import time

    barrier.wait()
    try:
        lock = acquire(storage, "r")
    except RunInUse:
        results.put("refused")
        return
    results.put("took")
    time.sleep(0.5)  # held while the others are still trying
    release(lock)


@pytest.mark.parametrize("stale", [False, True])
def test_jobs_starting_one_run_at_the_same_instant_let_one_take_it(tmp_path, stale):
    """Eight processes at once, on a free run or on one whose lock a killed job left: one takes it. Before, the lock
    was created empty and written after, so a competitor that read it in between took it as stale and removed it
    (in the first round here, at least 5 of the 8 took it)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for _ in range(5):
        run = tmp_path / f"s{_}" / "r"
        run.mkdir(parents=True)
        if stale:
            (run / LOCK).write_text(json.dumps({**owner(), "pid": 2**22 + 1, "started": "0"}))  # no such process
        barrier, results = ctx.Barrier(8), ctx.Queue()
        procs = [ctx.Process(target=contend, args=(str(run.parent), barrier, results)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        outcomes = sorted(results.get(timeout=5) for _ in procs)
        assert outcomes == ["refused"] * 7 + ["took"], outcomes
        assert sorted(p.name for p in run.iterdir()) == [GUARD]  # released; nothing else of the contest left
