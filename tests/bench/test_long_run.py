"""bench/long_run.py's readings: the job's epoch lines it parses (as the loop writes them), the background evaluations
it counts as pending, growth per 100 epochs and CPU per epoch from its samples."""

from __future__ import annotations

import argparse
import logging
from types import SimpleNamespace

import pytest
from support import bench_module

from ropim.train.task import Task


@pytest.fixture(scope="module")
def lr():
    with bench_module("long_run") as module:
        yield module


def test_epoch_lines_are_read_as_the_loop_writes_them(lr, caplog):
    fake = SimpleNamespace(cfg=SimpleNamespace(kind="pretrain", epochs=300), memory_shown=False, starving_shown=False,
                           first_epoch_line=None, epoch_period=None)
    metrics = {"epoch": 12, "epoch_time_s": 0.43, "img_per_s": 150.0, "peak_rss_mb": 1100.0}
    caplog.set_level(logging.INFO, logger="ropim.train")
    Task.log_epoch(fake, metrics, "loss 1.0374", "data wait 3.9%")  # the first line names the memory
    Task.log_epoch(fake, {**metrics, "epoch": 13}, "loss 1.0", "knn_top1 49.03%")
    found = [lr.EPOCH_LINE.match(r.getMessage()) for r in caplog.records]
    assert [(m[1], m[2], m[3]) for m in found] == [("12", "300", "0.4"), ("13", "300", "0.4")]
    assert lr.LATE_EVAL.match("[pretrain] epoch 5 evaluated beside training: knn_top1 49.30%")[1] == "5"


def test_pending_evaluations_and_growth(lr, tmp_path):
    args = argparse.Namespace(eval_every=5, run_name="r", num_workers=0)
    m = lr.Monitor(args, tmp_path)
    m.epochs = {e: {"job": 0, "inline_eval": e == 20} for e in range(1, 21)}
    m.collected = {5: 7}  # epoch 5's score came at epoch 7's end; 10 and 15 not yet; 20 was inline
    assert m.pending(6, 0) == 1 and m.pending(7, 0) == 0 and m.pending(20, 0) == 2
    assert m.pending(20, 1) == 0  # another job's submissions are not this one's

    def sample(epoch, rss, cpu):
        return {"epoch": epoch, "job": 0, "driver": {"pid": 1, "rss_mb": rss, "fds": 6, "threads": 7, "cpu_s": cpu},
                "workers": [], "children": 0, "tree_rss_mb": rss, "mlflow_db_mb": 1.0, "mlartifacts_mb": 0.0,
                "checkpoints": 3, "checkpoints_mb": 90.0, "run_other_mb": 0.0, "temp_checkpoints": 0,
                "ray_logs_mb": 0.0, "pending_evals": 1}

    samples = [sample(e, 1000 + 0.5 * e, 2.0 * e) for e in (1, 10, 20, 30, 40)]
    grown = lr.growth(samples, warmup=10)[0]
    assert grown["driver_rss_mb"]["per_100_epochs"] == pytest.approx(50.0)
    assert grown["checkpoints"]["per_100_epochs"] == 0.0
    assert grown["driver_rss_mb"]["first"] == 1010.0  # at epoch 20: the first sample 10 epochs after the first
    assert lr.cpu_per_epoch(samples) == {10: pytest.approx(2.0), 20: pytest.approx(2.0), 30: pytest.approx(2.0),
                                         40: pytest.approx(2.0)}
    assert "1020" in lr.table(samples, {e: 0.5 for e in range(1, 41)}, 10)
