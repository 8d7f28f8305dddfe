"""A worker waiting long for its next batch says so (``ropim.train.batch_wait``), instead of step lines that just stop
coming while a data pipeline stalls."""

from __future__ import annotations

import logging
import threading
import time

from gloo_loop import ToyTask, toy_loop_config

from ropim.train import batch_wait
from ropim.train.batch_wait import waits_said
from ropim.train.inprocess import LocalWorker
from ropim.train.loop import Loop
from ropim.train.task import EpochData


def slow(delays: list[float]):
    for i, delay in enumerate(delays):
        time.sleep(delay)
        yield i


def said(caplog, delays: list[float], after_s: float) -> tuple[list, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ropim.train"):
        got = list(waits_said(slow(delays), lambda waited: f"no batch for {waited:.1f} s", after_s=after_s))
    return got, [r.getMessage() for r in caplog.records]


def test_a_long_wait_is_said_once_per_period_and_short_ones_not_at_all(caplog):
    got, lines = said(caplog, [0.0, 0.05, 1.1, 0.05], after_s=0.4)
    assert got == [0, 1, 2, 3]
    assert len(lines) == 2 and all(line.startswith("no batch for ") for line in lines), lines  # at 0.4 s and 0.8 s
    assert 0.4 <= float(lines[0].split()[3]) < 0.8 <= float(lines[1].split()[3]) < 1.2  # polled every 0.1 s
    assert said(caplog, [0.05] * 12, after_s=0.4)[1] == []  # many short waits add up to more, each is short


def test_each_wait_is_judged_on_its_own(caplog):
    _, lines = said(caplog, [0.7, 0.01, 0.7], after_s=0.4)
    assert len(lines) == 2, lines  # the second long wait is said too, though the watcher said the first


def test_the_watcher_ends_with_the_iteration_or_when_dropped():
    before = threading.active_count()
    batches = waits_said(slow([0.0] * 5), str, after_s=0.4)
    assert next(batches) == 0 and threading.active_count() == before + 1
    del batches  # an epoch ended early: the generator is closed, its watcher stops
    assert threading.active_count() == before
    list(waits_said(slow([0.0] * 3), str))
    assert threading.active_count() == before


def test_the_loop_says_which_worker_waits_for_which_step(tmp_path, caplog, monkeypatch):
    class SlowSecondBatch(ToyTask):
        def data(self, worker, micro_batch: int) -> EpochData:
            listed = super().data(worker, micro_batch)

            def batches(epoch: int):
                for i, batch in enumerate(listed.batches(epoch)):
                    time.sleep(0.7 if i == 2 else 0.0)  # the first micro batch of step 2
                    yield batch

            return EpochData(batches, listed.steps)

    monkeypatch.setattr(batch_wait, "WAIT_S", 0.4)
    loop = Loop(SlowSecondBatch({0: 4}, 2, str(tmp_path)), toy_loop_config(), LocalWorker(tmp_path, 1))
    with caplog.at_level(logging.WARNING, logger="ropim.train"):
        assert loop.train_epoch(0).steps == 2
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("[toy] worker 0: no batch for 0 s (epoch 1, step 2): the data "
                                                   "pipeline is not keeping up"), lines
