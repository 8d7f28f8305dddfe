"""Evaluations off the training path: an intermediate epoch's kNN evaluation runs in a background thread while the
next epochs train and are recorded, lands in MLflow at its own epoch, and the final epoch's evaluation is inline (in
the job's last report, where Tune reads it) and complete before the encoder is registered."""

from __future__ import annotations

import threading

from support import tiny_pretrain

from ropim.tracking import store
from ropim.train.driver import run
from ropim.train.pretrain import task as module


def test_training_goes_on_while_an_evaluation_runs(workdir, monkeypatch):
    recorded = threading.Event()  # set once epoch 3's metrics are in MLflow
    log_epochs = store.log_epochs

    def logging(run_id, epochs, uri=None):
        log_epochs(run_id, epochs, uri)
        if any(m["epoch"] == 3 and "loss" in m for m in epochs):
            recorded.set()

    calls = []

    def slow_scores(encoder, img_size, data, knn_k=20, linear=True):
        """The test hook: epoch 2's evaluation (the first) ends only after epoch 3 has been trained and recorded;
        a loop that waited for it would wait here until the timeout."""
        first = not calls
        calls.append({"thread": threading.current_thread().name, "saw_epoch_3": recorded.is_set()})
        if first:
            calls[-1]["saw_epoch_3"] = recorded.wait(timeout=60)
        return {"knn_top1": 10.0 * len(calls)}

    monkeypatch.setattr(store, "log_epochs", logging)
    monkeypatch.setattr(module, "frozen_scores", slow_scores)
    cfg = tiny_pretrain(run_name="background-eval", num_workers=0, epochs=4, max_steps_per_epoch=2, eval_every=2)
    result = run(cfg)

    assert calls[0] == {"thread": "ropim-eval_0", "saw_epoch_3": True}  # training went on past epoch 3
    assert calls[1]["thread"] == threading.current_thread().name  # the final epoch: inline, in the loop
    assert result.metrics["epoch"] == 4 and result.metrics["knn_top1"] == 20.0  # in the last report (Tune's)
    assert result.model_uri is not None
    c = store.client()
    knn = sorted(c.get_metric_history(result.run_id, "knn_top1"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in knn] == [(2, 10.0), (4, 20.0)]  # each at its own epoch, once
    loss = {m.step: m for m in c.get_metric_history(result.run_id, "loss")}
    assert sorted(loss) == [1, 2, 3, 4]
    assert knn[0].timestamp >= loss[3].timestamp  # epoch 2's score was logged after epoch 3 was
    assert c.get_run(result.run_id).info.status == "FINISHED"
