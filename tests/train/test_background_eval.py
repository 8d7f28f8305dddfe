"""Evaluations off the training path: an intermediate epoch's kNN evaluation runs in a background thread while the
next epochs train and are recorded, lands in MLflow at its own epoch, and the final epoch's evaluation is inline (in
the job's last report, where Tune reads it) and complete before the encoder is registered."""

from __future__ import annotations

import copy
import gc
import multiprocessing
import signal
import threading
import time
import weakref

import pytest
import torch
from support import tiny_pretrain

from ropim.eval.features import Cancelled
from ropim.tracking import store
from ropim.tracking.signals import Interrupted
from ropim.train.background import Background
from ropim.train.driver import run
from ropim.train.pretrain import task as module


def test_training_goes_on_while_an_evaluation_runs(workdir, monkeypatch):
    recorded = threading.Event()  # set once epoch 3's metrics are in MLflow
    log_epochs = store.log_epochs

    def logging(run_id, epochs, uri=None):
        log_epochs(run_id, epochs, uri)
        if any(m["epoch"] == 3 and "loss" in m for m in epochs):
            recorded.set()

    calls, banks = [], []

    def slow_scores(encoder, img_size, data, knn_k=20, linear=True, cancelled=None, progress=None, worker=None,
                    processes=0, train_images=None):
        """The test hook: epoch 2's evaluation (the first) ends only after epoch 3 has been trained and recorded;
        a loop that waited for it would wait here until the timeout."""
        banks.append(train_images)
        first = not calls
        calls.append({"thread": threading.current_thread().name, "saw_epoch_3": recorded.is_set()})
        if first:
            calls[-1]["saw_epoch_3"] = recorded.wait(timeout=60)
        return {"knn_top1": 10.0 * len(calls)}

    monkeypatch.setattr(store, "log_epochs", logging)
    monkeypatch.setattr(module, "frozen_scores", slow_scores)
    cfg = tiny_pretrain(run_name="background-eval", num_workers=0, epochs=4, max_steps_per_epoch=2, eval_every=2,
                        eval_train_images=50)
    result = run(cfg)

    assert calls[0] == {"thread": "ropim-eval_0", "saw_epoch_3": True}  # training went on past epoch 3
    assert calls[1]["thread"] == threading.current_thread().name  # the final epoch: inline, in the loop
    assert banks == [50, 50]  # both evaluations on the job's sample of the train split
    assert result.metrics["epoch"] == 4 and result.metrics["knn_top1"] == 20.0  # in the last report (Tune's)
    assert result.model_uri is not None
    c = store.client()
    knn = sorted(c.get_metric_history(result.run_id, "knn_top1"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in knn] == [(2, 10.0), (4, 20.0)]  # each at its own epoch, once
    loss = {m.step: m for m in c.get_metric_history(result.run_id, "loss")}
    assert sorted(loss) == [1, 2, 3, 4]
    assert knn[0].timestamp >= loss[3].timestamp  # epoch 2's score was logged after epoch 3 was
    assert c.get_run(result.run_id).info.status == "FINISHED"


def test_a_job_due_while_one_is_unfinished_waits_for_it():
    """``make_room`` (called by ``submit``) holds the caller while ``limit`` jobs are unfinished: what keeps one
    copy of the encoder in flight, not one per epoch."""
    gate, bg = threading.Event(), Background("test-bg", limit=1)
    bg.submit(1, lambda: gate.wait(10) and {"m": 1.0})
    second = threading.Thread(target=lambda: bg.submit(2, lambda: {"m": 2.0}))
    second.start()
    second.join(0.3)
    assert second.is_alive() and list(bg.pending) == [1]  # still waiting for epoch 1's job
    gate.set()
    second.join(10)
    assert bg.collect(wait=True) == [{"epoch": 1, "m": 1.0}, {"epoch": 2, "m": 2.0}]
    assert bg.make_room() == 0.0  # nothing unfinished: no wait
    bg.close()


def test_a_process_a_job_forks_exits_as_it_ended():
    """An evaluation's DataLoader processes are forked from the background thread. From a ``ThreadPoolExecutor``'s,
    every one exited with code 1 (the pool's exit hook, copied into it, joined the copied thread: itself), which
    torch's DataLoader raised in the training loop as a crashed worker whenever that exit reached it first (1 of 40
    runs of ``test_evaluations_decode_in_the_jobs_dataloader_processes``)."""
    bg = Background("test-fork")

    def forks() -> dict[str, float]:
        child = multiprocessing.get_context("fork").Process(target=int)
        child.start()
        child.join(30)
        return {"exitcode": float(child.exitcode)}

    bg.submit(1, forks)
    bg.submit(2, forks)
    assert bg.collect(wait=True) == [{"epoch": 1, "exitcode": 0.0}, {"epoch": 2, "exitcode": 0.0}]  # before: 1.0
    bg.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("test-fork")]  # no thread left to hold the exit


def test_evaluations_slower_than_epochs_do_not_pile_up(workdir, monkeypatch, caplog):
    """eval_every=1 with an evaluation slower than the epochs (a 300-epoch rehearsal): before, the evaluations queued
    up for the rest of the run, each holding a copy of the encoder (45 at epoch 60 of the digits preset, +9 MiB per
    epoch) and the job's end waited for all of them. Now one runs beside training at a time, training waits for it
    (one line says so), and every epoch's score is still recorded once."""
    copies: weakref.WeakSet = weakref.WeakSet()  # the encoder copies made for the background thread, while alive
    most = [0]
    deepcopy = copy.deepcopy

    def tracked(x, *args):
        y = deepcopy(x, *args)
        if isinstance(y, torch.nn.Module):
            copies.add(y)
            gc.collect()
            most[0] = max(most[0], len(copies))
        return y

    recorded, held, log_epochs = threading.Event(), threading.Event(), store.log_epochs
    make_room = getattr(Background, "make_room", None)  # (None before the bound existed)

    def logging(run_id, epochs, uri=None):
        log_epochs(run_id, epochs, uri)
        if any(m["epoch"] == 4 and "loss" in m for m in epochs):
            recorded.set()

    def holding(self):
        if any(not f.done() for f in self.pending.values()):
            held.set()  # the loop is held until the evaluation running ends
        return make_room(self)

    def slow_scores(encoder, img_size, data, knn_k=20, linear=True, cancelled=None, progress=None, worker=None,
                    processes=0, train_images=None):
        """Epoch 1's evaluation lasts until epoch 4 is recorded (before) or the loop waits for it (now), then 0.1 s."""
        while not (recorded.is_set() or held.is_set()):
            time.sleep(0.01)
        time.sleep(0.1)
        return {"knn_top1": 1.0}

    monkeypatch.setattr(copy, "deepcopy", tracked)
    monkeypatch.setattr(store, "log_epochs", logging)
    monkeypatch.setattr(module, "frozen_scores", slow_scores)
    if make_room is not None:
        monkeypatch.setattr(Background, "make_room", holding)
    caplog.set_level("INFO", logger="ropim.train")
    result = run(tiny_pretrain(run_name="eval-every-epoch", num_workers=0, epochs=5, max_steps_per_epoch=1,
                               eval_every=1, checkpoint_every=100, registered_model="", precision="fp32"))
    assert most[0] <= 2, most  # the copy evaluated and the next one (before: 4 by epoch 4, one per epoch)
    knn = store.client().get_metric_history(result.run_id, "knn_top1")
    assert sorted(m.step for m in knn) == list(range(1, 6))  # every epoch's score, once
    waits = [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]
    assert len(waits) == 1 and "eval_every=1" in waits[0], waits


def stopped_while_evaluating(monkeypatch, run_name: str) -> list[str]:
    """Run a 4-epoch job whose epoch-2 evaluation (beside training) runs until it is cancelled (at most 30 s), stopped
    by a SIGTERM raised where epoch 3 is recorded; how the evaluation ended ("cancelled" or "ran to its end")."""
    started, ended = threading.Event(), []

    def endless_scores(encoder, img_size, data, knn_k=20, linear=True, cancelled=None, progress=None, worker=None,
                       processes=0, train_images=None):
        started.set()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 30 and not (cancelled is not None and cancelled()):
            time.sleep(0.01)
        ended.append("cancelled" if cancelled is not None and cancelled() else "ran to its end")
        raise Cancelled("cancelled")

    log_epochs = store.log_epochs

    def stopping(run_id, epochs, uri=None):
        if any(m["epoch"] == 3 for m in epochs) and started.wait(10):
            raise Interrupted(signal.SIGTERM)
        log_epochs(run_id, epochs, uri)

    with monkeypatch.context() as m:
        m.setattr(module, "frozen_scores", endless_scores)
        m.setattr(store, "log_epochs", stopping)
        with pytest.raises(KeyboardInterrupt):
            run(stopping_job(run_name))
    return ended


def stopping_job(run_name: str):
    return tiny_pretrain(run_name=run_name, num_workers=0, epochs=4, max_steps_per_epoch=1, eval_every=2,
                         registered_model="", precision="fp32")


def test_a_stop_ends_the_evaluation_in_flight(workdir, monkeypatch):
    """A stop (raised here where epoch 3 is recorded) while epoch 2's evaluation runs beside training: the evaluation
    ends at its next batch, unrecorded. Before, it ran to its end after the job had stopped, holding the process's
    exit (Python joins the pool's thread): a 30-epoch rehearsal's SIGTERM took 8.4 s to exit instead of 4.0 s."""
    ended = stopped_while_evaluating(monkeypatch, "stopped-while-evaluating")
    assert ended == ["cancelled"], ended  # before: it ran to its end after the job had stopped
    assert not [t for t in threading.enumerate() if t.name.startswith("ropim-eval")]


def test_a_resume_evaluates_the_epoch_whose_evaluation_a_stop_cut_short(workdir, monkeypatch, caplog):
    """The stop above, then the same job again: it resumes from epoch 2's checkpoint, which is not trained again, so
    it evaluates those restored weights beside training. Before, the run never had a kNN score for epoch 2."""
    stopped_while_evaluating(monkeypatch, "resumed-after-evaluating")
    scored = []

    def scores(encoder, img_size, data, knn_k=20, linear=True, cancelled=None, progress=None, worker=None,
               processes=0, train_images=None):
        scored.append(sum(float(p.detach().sum()) for p in encoder.parameters()))
        return {"knn_top1": 50.0 + len(scored)}

    monkeypatch.setattr(module, "frozen_scores", scores)
    caplog.set_level("INFO", logger="ropim.train")
    result = run(stopping_job("resumed-after-evaluating"))
    knn = sorted(store.client().get_metric_history(result.run_id, "knn_top1"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in knn] == [(2, 51.0), (4, 52.0)]  # epoch 2 scored first, on its own weights
    said = [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
    assert said == ["[pretrain] epoch 2's evaluation did not finish before the job stopped: evaluating the restored "
                    "weights beside training"]
    assert len(set(scored)) == 2  # two sets of weights: epoch 2's (restored), epoch 4's


def test_an_extraction_asked_to_end_raises_cancelled():
    """``extract_features`` asks ``cancelled`` before each batch."""
    from ropim.eval.features import extract_features

    encoder = torch.nn.Linear(4, 2)
    encoder.forward_features = encoder.forward
    encoder.forward_head = lambda f, pre_logits: f
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.zeros(8, dtype=torch.long))
    asked = []
    with pytest.raises(Cancelled, match="after 2 of 4 batches"):
        extract_features(encoder, data, batch_size=2, cancelled=lambda: asked.append(1) or len(asked) > 2)
    assert extract_features(encoder, data, batch_size=2, cancelled=lambda: False)[0].shape == (8, 2)
