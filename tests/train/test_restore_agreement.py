"""Workers that restore different checkpoints (one worker's read of the latest failed, it took the one before) would
train apart from there, with different optimizer states, steps and epoch counts: the loop finds it before the first
step, and every worker fails with one line instead of training on (or hanging at the run's end)."""

from __future__ import annotations

import torch
from gloo_loop import two_rank_restore
from support import on_two_ranks

from ropim.train.checkpoint import save_checkpoint


def checkpoint(folder, epoch: int) -> str:
    """A toy-task checkpoint of ``epoch`` (0-based) at step 2 × (epoch + 1)."""
    folder.mkdir()
    model = torch.nn.Linear(4, 1)
    save_checkpoint(folder, model, torch.optim.SGD(model.parameters(), lr=0.1), None, epoch, 2 * (epoch + 1), {})
    return str(folder)


def test_workers_that_restore_different_checkpoints_all_fail_before_training(tmp_path):
    latest, earlier = checkpoint(tmp_path / "latest", 1), checkpoint(tmp_path / "earlier", 0)
    raised = {rank: values[0] for rank, values in
              on_two_ranks(two_rank_restore, tmp_path, latest, earlier, str(tmp_path), timeout=90).items()}
    for rank in (0, 1):  # both, so that neither waits for the other in a collective
        assert raised[rank].startswith("RuntimeError: [toy] the workers restored different checkpoints (rank 0: "
                                       "epoch 2 step 4, rank 1: epoch 1 step 2"), raised[rank]
    assert "could not load: latest (" in raised[1] and "could not load: none)" in raised[0]
