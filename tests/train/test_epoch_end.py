"""The loop's epoch end: data that runs out inside a step (gradient accumulation) leaves no gradient behind, workers
with unequal batch counts end the epoch together instead of hanging in DDP's all-reduce, and a StopIteration raised
by a task's own code is an error, not the end of the data."""

from __future__ import annotations

import logging

import pytest
import torch
from gloo_loop import ToyTask, toy_loop_config, two_rank_loop
from support import on_two_ranks

from ropim.train.inprocess import LocalWorker
from ropim.train.loop import Loop


def weights_after(tmp_path, batches: int) -> torch.Tensor:
    """The toy model's weights after 2 in-process epochs of ``batches`` micro batches (2 per step, 2 steps listed)."""
    task = ToyTask({0: batches}, 2, str(tmp_path))
    Loop(task, toy_loop_config(), LocalWorker(tmp_path / f"ckpt{batches}", 1)).run()
    assert task.clean == [True, True]  # after each epoch, no gradient is left for the next one
    return torch.cat([p.detach().flatten() for p in task.model.parameters()])


def test_unfinished_accumulation_is_dropped_not_applied_next_epoch(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="ropim.train"):
        odd = weights_after(tmp_path, 3)  # step 2 of each epoch has 1 of its 2 micro batches
    whole = weights_after(tmp_path, 2)  # the same first step, and nothing else
    assert torch.equal(odd, whole)
    dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 2 and "micro batches per worker [1], accum_steps 2" in dropped[0]


def test_stop_iteration_from_the_task_is_raised(tmp_path):
    task = ToyTask({0: 4}, 2, str(tmp_path), fail_at=1)
    loop = Loop(task, toy_loop_config(), LocalWorker(tmp_path, 1))
    with pytest.raises(StopIteration, match="raised by the task's own code"):
        loop.train_epoch(0)


def test_workers_with_unequal_batches_end_the_epoch_together(tmp_path):
    batches = {0: 5, 1: 3}  # both list 3 steps of 2; rank 1 runs out inside step 2, rank 0 inside step 3
    got = on_two_ranks(two_rank_loop, tmp_path, batches, 3, str(tmp_path), timeout=90)  # a hang in DDP's all-reduce
    for rank in (0, 1):
        assert not isinstance(got[rank][0], str), got[rank][0]  # not an error's traceback
        assert got[rank][0] == [1, 2], got[rank][0]  # one step per epoch on both workers
        assert got[rank][1] == [True, True]
    assert got[0][2] == got[1][2]  # the same weights on both workers
