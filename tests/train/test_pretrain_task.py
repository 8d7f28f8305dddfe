"""The pretraining task's corruptions: every image of a step gets its own sketch, also when the step's images come
in several micro batches (``accum_steps`` > 1), and the draws repeat exactly from (seed, step, rank)."""

from __future__ import annotations

import pytest
import torch
from support import decode_in_loader_processes, tiny_pretrain

from ropim.train.pretrain.task import PretrainTask, sketch_generator
from ropim.train.runtime import LocalWorker


def sketches_of(task: PretrainTask, steps: list[int], images: int = 4) -> list[torch.Tensor]:
    """The bucket ids (images, tokens) the task draws for one micro batch at each of ``steps``, in order."""
    drawn = []

    def model(imgs, corruption):  # what the loop's model gets: the loss of the drawn corruption
        drawn.append(corruption.h.clone())
        return imgs.sum(), None, None

    for step in steps:
        task.loss(model, (torch.zeros(images, 3, 32, 32),), step)
    return drawn


def new_task(tmp_path, **changes) -> PretrainTask:
    worker = LocalWorker(tmp_path, 1)
    cfg = tiny_pretrain(**{"accum_steps": 2, "viz_every": 0, **changes}).to_dict()
    task = PretrainTask({"cfg": cfg, "n_train": 64, "run_id": "", "tracking_uri": "", "run_dir": str(tmp_path)}, worker)
    task.build(worker)
    return task


def test_the_micro_batches_of_a_step_get_sketches_of_their_own(tmp_path):
    task = new_task(tmp_path)
    first, second, next_step = sketches_of(task, [5, 5, 6])  # step 5's two micro batches, then step 6's first
    assert not torch.equal(first, second)  # before: the same (h, s) for image k of every micro batch of a step
    # a step's first micro batch draws what it always did: (seed, step, rank) alone
    alone = task.model.draw_corruption(4, sketch_generator(task.cfg.seed, 5, 0, torch.device("cpu"))).h
    assert torch.equal(first, alone) and not torch.equal(next_step, first)
    assert all(torch.equal(a, b) for a, b in zip(sketches_of(new_task(tmp_path), [5, 5, 6]), [first, second, next_step],
                                                 strict=True))  # a resumed run draws the same


@pytest.mark.parametrize("ingest", ["torch", "ray_data"])
def test_evaluations_decode_in_the_jobs_dataloader_processes(tmp_path, monkeypatch, ingest):
    decode_in_loader_processes(monkeypatch)
    tiny_pretrain(ingest=ingest, dataloader_workers=2, num_workers=1).check()  # before: refused with Ray Data
    task = new_task(tmp_path, dataloader_workers=2, knn_k=5, ingest=ingest)
    inline = task.evaluate(task.model, 1, final=True)  # before: decoded in the training process, between steps
    assert task.evaluate(task.model, 1, final=False) == {}  # beside training: in a thread, which starts the processes
    assert task.evaluations(wait=True) == [{"epoch": 1, **inline}] and 0 <= inline["knn_top1"] <= 100
