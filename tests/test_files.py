"""A file written whole: the old one or the new one, never part; two writers at once, each whole."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from ropim.files import written_whole


def write(path: str, text: str, barrier) -> None:
    with written_whole(Path(path)) as tmp, open(tmp, "w") as f:
        f.write(text[: len(text) // 2])
        f.flush()
        barrier.wait()  # both writers half-way through at once
        f.write(text[len(text) // 2:])


def test_two_writers_at_once_leave_one_whole_file_and_no_temporary(tmp_path):
    """Before, the probe's cache used one temporary name per file: the second rename failed once its features were
    extracted (FileNotFoundError), or a reader got the other writer's half."""
    path = tmp_path / "features.safetensors"
    texts = ["a" * 100_000, "b" * 100_000]
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=write, args=(str(path), t, barrier)) for t in texts]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert path.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_write_that_fails_keeps_the_old_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "transfer.csv"
    path.write_text("old")
    with pytest.raises(RuntimeError), written_whole(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("stopped")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == [path.name]
