"""The one training loop, for every job: pretraining and fine-tuning supply a ``Task`` (model, batches, batch →
loss, evaluation, what rank 0 logs), the loop does the rest on one worker of a ``Worker`` (Ray Train or in-process):

    restore the latest checkpoint (nothing left to train: report its epoch again) → agree on the steps per epoch
    (the fewest any worker's data lists) → for each epoch: seed (seed, epoch, rank) → optimizer steps of
    ``accum_steps`` micro batches, fetched first, while every worker has them (the task's ``before_step``, autocast
    bf16/fp16 + grad scaler, clipping, timm's cosine or poly (power 1) schedule per step, over all steps or after
    the warm-up, a progress line every ``log_every`` steps) → epoch stats over all workers → evaluation when due →
    rank 0's epoch hook, its metrics recorded in MLflow → checkpoint when due → report.

Speed options (``JobConfig``'s): ``channels_last`` weights, ``compile`` (torch.compile of the model the loss sees,
DDP-wrapped or not), ``tf32`` matmuls while the loop runs. Evaluations a task starts in the background are collected
at epoch ends and recorded with the epoch that collects them; the loop waits for them only after its last epoch (and,
one at a time, when the next is due before the last has ended: ``ropim.train.background``); a stop or a failure ends
the one in flight unrecorded (``drop_evaluations``), and the job that continues from that epoch's checkpoint evaluates
it again (the task's ``resumed``).

Checkpoints hold ``model.safetensors``, ``train_state.pt`` (optimizer, scaler, epoch, step) and ``metrics.json``
(the epoch's metrics and the task's ``checkpoint_extra``), and ``unrecorded.json`` while the tracking store has not
taken some epochs' records (a job continuing from it sends them: ``Task.record``). Random state needs no saving:
every epoch reseeds torch, ``random`` and numpy from (seed, epoch, rank), and tasks seed per-step randomness
(sketches) from the step.
"""

from __future__ import annotations

import contextlib
import logging
import random
import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from timm.scheduler import CosineLRScheduler, PolyLRScheduler

from ropim.console import eta_text
from ropim.seeds import derived_seed
from ropim.train.batch_wait import STALLED, waits_said
from ropim.train.checkpoint import folder_bytes, restore, room_note, write_checkpoint
from ropim.train.guard import Diverged, StepGuard, write_stop
from ropim.train.job import JobConfig
from ropim.train.speed import autocast_dtype, grad_scaler, grads_in_weight_strides, resolve_precision, tf32_matmuls
from ropim.train.task import Task, Worker

log = logging.getLogger("ropim.train")
END = object()  # what ``next(batches, END)`` gives once an epoch's batches run out


def seed_everything(seed: int) -> None:
    """Seed torch, python ``random`` (RandAugment, erasing) and numpy (Mixup)."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated GPU memory, or this process's peak resident memory on CPU, in MiB."""
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB: what Ray's memory monitor weighs against the node's memory."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


@dataclass
class EpochTally:
    """What one worker measured in one epoch."""

    loss_sum: torch.Tensor  # sum over steps of the step's mean loss
    norm_sum: torch.Tensor  # sum over the applied steps of the gradients' norm before clipping
    clipped: torch.Tensor  # applied steps whose norm exceeded clip_grad
    steps: int = 0
    applied: int = 0  # steps that reached the weights (fp16's scaler skips some)
    images: int = 0
    wait_s: float = 0.0  # time spent waiting for the next batch
    time_s: float = 0.0


class Loop:
    """The state of one worker's training run (model, optimizer, schedule, step) and its epoch."""

    def __init__(self, task: Task, cfg: JobConfig, worker: Worker) -> None:
        self.task, self.cfg, self.worker = task, cfg, worker
        seed_everything(cfg.seed)  # identical initial weights on every rank
        self.model, self.optimizer = task.build(worker)
        if cfg.channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.precision = resolve_precision(cfg.precision, worker.device)
        if worker.rank == 0 and cfg.precision != self.precision:
            log.info(f"[{cfg.kind}] precision {cfg.precision} -> {self.precision} on {worker.device.type}")
        self.scaler = grad_scaler(self.precision)
        self.start_epoch, self.step, self.restored_metrics = 0, 0, {}
        state, unreadable = restore(worker.restorable(), self.model, self.optimizer, self.scaler)
        if state is not None:
            self.start_epoch, self.step, self.restored_metrics = state["epoch"] + 1, state["step"], state["metrics"]
            task.unsent = state["unrecorded"] if worker.rank == 0 else []  # records the store had not taken then
            if worker.rank == 0:
                skipped = f" ({'; '.join(unreadable)} cannot be loaded: the previous complete checkpoint is used)" \
                    if unreadable else ""
                log.info(f"[{cfg.kind}] resumed from epoch {self.start_epoch}, step {self.step}{skipped}")
        restored = worker.gather(torch.tensor([self.start_epoch, self.step], dtype=torch.float64))  # (world, 2)
        if (restored != restored[0]).any():  # e.g. a read that failed on one worker only: weights would drift apart
            found = ", ".join(f"rank {r}: epoch {int(e)} step {int(s)}" for r, (e, s) in enumerate(restored.tolist()))
            raise RuntimeError(f"[{cfg.kind}] the workers restored different checkpoints ({found}; this worker could "
                               f"not load: {'; '.join(unreadable) or 'none'}): failing, so that a restart "
                               "(max_failures) reads them again")
        grads_in_weight_strides(self.model)
        self.ddp_model = worker.prepare(self.model)
        if cfg.compile:  # the task's loss calls it; evaluation and checkpoints use the plain model
            self.ddp_model = torch.compile(self.ddp_model)
        self.data = task.data(worker, cfg.batch // (worker.world * cfg.accum_steps))
        listed = worker.gather(torch.tensor([self.data.steps], dtype=torch.float64))  # every worker's count
        self.steps = cfg.steps_per_epoch(int(listed.min()))  # the same on every worker: so are the schedule and ETA
        if self.steps < 1:
            raise ValueError(f"global batch {cfg.batch} is larger than the training split per worker")
        self.total_steps = cfg.epochs * self.steps
        schedule, shape = {"cosine": (CosineLRScheduler, {}), "poly": (PolyLRScheduler, {"power": 1.0})}[cfg.schedule]
        warmup = round(cfg.warmup_epochs * self.steps)
        decay = max(1, self.total_steps - warmup) if cfg.warmup_prefix else self.total_steps
        self.scheduler = schedule(self.optimizer, t_initial=decay, lr_min=cfg.min_lr, warmup_t=warmup,
                                  warmup_lr_init=cfg.min_lr, warmup_prefix=cfg.warmup_prefix, t_in_epochs=False,
                                  **shape)  # timm's, stepped per optimizer step
        self.scheduler.step_update(self.step)
        self.amp_dtype = autocast_dtype(self.precision)
        task.total_steps, task.amp_dtype = self.total_steps, self.amp_dtype  # what the task may plan by
        self.guard = StepGuard(cfg.clip_grad, cfg.max_skipped_steps, self.precision)
        self.room_checked = False  # whether the run's disk was checked for room (``room_note``, rank 0)

    @property
    def lr(self) -> float:
        return max(g["lr"] for g in self.optimizer.param_groups)

    def train_epoch(self, epoch: int) -> EpochTally:
        """Up to ``self.steps`` optimizer steps, each over ``accum_steps`` micro batches; every worker ends the epoch
        at the first step some worker lacks the data for (``next_step``)."""
        cfg, worker, device = self.cfg, self.worker, self.worker.device
        tally, t0 = EpochTally(*(torch.zeros((), device=device) for _ in range(3))), time.perf_counter()
        batches = waits_said(self.data.batches(epoch), lambda waited: f"[{cfg.kind}] worker {worker.rank}: no batch "
                             f"for {waited:.0f} s (epoch {epoch + 1}, step {self.step + 1}): {STALLED}")
        for _ in range(self.steps):
            micro = self.next_step(batches, tally, epoch)
            if micro is None:
                break
            self.task.before_step(self.step)
            for i, batch in enumerate(micro):
                sync = i + 1 == cfg.accum_steps or worker.world == 1
                no_sync = self.ddp_model.no_sync() if not sync else contextlib.nullcontext()
                with no_sync, torch.autocast(device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                    loss, n = self.task.loss(self.ddp_model, batch, self.step)
                    scaled = loss / cfg.accum_steps
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                tally.loss_sum += loss.detach().float() / cfg.accum_steps
                tally.images += n
            self.apply(tally, loss, epoch)
            self.step += 1
            tally.steps += 1
            self.scheduler.step_update(self.step)
            if worker.rank == 0 and self.step % cfg.log_every == 0:  # the task's epoch line ends an epoch
                self.progress(epoch, loss, tally, t0)
        tally.time_s = time.perf_counter() - t0
        return tally

    def apply(self, tally: EpochTally, loss: torch.Tensor, epoch: int) -> None:
        """The step's gradients to the weights (``StepGuard``: clipped, checked); their norm into ``tally``."""
        norm = self.guard.step(self.optimizer, self.scaler, self.model.parameters,
                               lambda norm: f"step {self.step + 1} (epoch {epoch + 1}): gradient norm {norm:.4g}, "
                                            f"loss {loss.item():.4g} at lr {self.lr:.3g}")
        if norm is not None:  # summed on the device: no sync
            tally.norm_sum += norm.float()
            tally.applied += 1
            if self.cfg.clip_grad:
                tally.clipped += norm > self.cfg.clip_grad

    def next_step(self, batches: Iterator, tally: EpochTally, epoch: int) -> list | None:
        """The ``accum_steps`` micro batches of the next optimizer step, or None on every worker when some worker's
        data ends before them. Fetched before any is computed, so an unfinished step leaves no gradient behind and no
        worker waits in DDP's all-reduce for one that ran out; a step some worker had part of is dropped (one line)."""
        k, t_wait, micro = self.cfg.accum_steps, time.perf_counter(), []
        while len(micro) < k and (batch := next(batches, END)) is not END:
            micro.append(batch)
        tally.wait_s += time.perf_counter() - t_wait
        mine = torch.tensor([len(micro)], dtype=torch.float64)
        if (total := int(self.worker.summed(mine)[0])) == k * self.worker.world:  # one value over the wire a step
            return micro
        counts = [int(c) for c in self.worker.gather(mine)[:, 0]]  # the data ended on some worker: which had what
        if self.worker.rank == 0 and total > 0:
            log.info(f"[{self.cfg.kind}] epoch {epoch + 1}: the data ended inside step {self.step + 1} (micro batches "
                     f"per worker {counts}, accum_steps {k}): that step is dropped on every worker, no gradient "
                     f"applied; the epoch ends after {tally.steps} of {self.steps} steps")
        return None

    def progress(self, epoch: int, loss: torch.Tensor, tally: EpochTally, t0: float) -> None:
        """Rank 0's step line. Its ETA: this epoch's steps left at this epoch's rate, then the later epochs at the
        task's measured time from one epoch line to the next (before it has one, at this epoch's rate too), as the
        epoch lines say it."""
        rate = tally.images * self.worker.world / (time.perf_counter() - t0)
        period = self.task.epoch_period
        if period is None:
            left = (self.total_steps - self.step) * self.cfg.batch / rate
        else:
            left = (self.steps - tally.steps) * self.cfg.batch / rate + (self.cfg.epochs - epoch - 1) * period
        eta = eta_text(left)
        # logging, not print: Ray Train's print patch would echo each line twice
        log.info(f"[{self.cfg.kind}] epoch {epoch + 1}/{self.cfg.epochs} step {self.step}/{self.total_steps} "
                 f"loss {loss.item():.4f} lr {self.lr:.2e} {rate:.1f} img/s ETA {eta}")

    def epoch_stats(self, tally: EpochTally) -> dict[str, float]:
        """The epoch over all workers: mean loss and wait share, total img/s, slowest epoch time, peak memory (the
        device's, and the largest worker's resident memory), the gradients' mean norm before clipping (and, with
        ``clip_grad``, the share of steps it clipped; with fp16's scaler, the steps it skipped), and the task's extra
        statistics (summed or maxed)."""
        extra, applied = self.data.stats, max(tally.applied, 1)
        values = [tally.loss_sum.item() / max(tally.steps, 1), tally.images, tally.time_s,
                  peak_memory_mb(self.worker.device), tally.wait_s / max(tally.time_s, 1e-9), peak_rss_mb(),
                  tally.norm_sum.item() / applied, tally.clipped.item() / applied,
                  *(read() for read, _ in extra.values())]
        g = self.worker.gather(torch.tensor(values, dtype=torch.float64))  # (world, k)
        reduced = [g[:, 0].mean(), g[:, 1].sum(), g[:, 2].max(), g[:, 3].max(), g[:, 4].mean(), g[:, 5].max(),
                   g[:, 6].mean(), g[:, 7].mean()]  # the norms: DDP's all-reduced gradients, alike on every worker
        reduced += [g[:, 8 + i].sum() if how == "sum" else g[:, 8 + i].max()
                    for i, (_, how) in enumerate(extra.values())]
        loss, images, time_s, peak_mb, wait_share, rss_mb, norm, clipped, *rest = (v.item() for v in reduced)
        return {self.task.loss_name: loss, "img_per_s": images / time_s, "epoch_time_s": time_s,
                "peak_mem_mb": peak_mb, "peak_rss_mb": rss_mb, "data_wait_share": wait_share, "grad_norm": norm,
                **({"clipped_share": clipped} if self.cfg.clip_grad else {}), **dict(zip(extra, rest, strict=True)),
                **({"skipped_steps": tally.steps - tally.applied} if self.scaler else {})}  # alike on every worker

    def run(self) -> None:
        """Train from the restored epoch to the job's last epoch; record and report every epoch, checkpoint when
        due."""
        cfg, worker = self.cfg, self.worker
        last_epoch = cfg.last_epoch(self.start_epoch)
        try:
            if self.start_epoch > 0:
                self.task.resumed(self.model, self.start_epoch)
            if self.start_epoch >= last_epoch:  # nothing left to train: the latest checkpoint's epoch is the result
                worker.report(self.restored_metrics, None)  # (a Tune trial's, which a stopped sweep may not have saved)
            for epoch in range(self.start_epoch, last_epoch):
                try:
                    self.run_epoch(epoch, last_epoch)
                except Diverged as err:  # every rank sees the same all-reduced gradients, so all stop here
                    if worker.rank == 0:
                        write_stop(self.task.run_dir, str(err), epoch + 1, self.step)
                    break
            late = self.task.evaluations(wait=True)  # background evaluations still running: their epochs are saved
        except BaseException:  # a stop signal or a failure: an evaluation in flight would hold the exit, unrecorded
            self.task.drop_evaluations()
            raise
        if worker.rank == 0:
            self.task.record(late, last=True)  # with any records the store had not taken: the job fails without them

    def run_epoch(self, epoch: int, last_epoch: int) -> None:
        """One epoch: train, evaluate when due, record its metrics (and the evaluations finished in the background)
        before its checkpoint uploads, so that a run lost while uploading keeps them; report (with the checkpoint
        when due)."""
        cfg, worker = self.cfg, self.worker
        seed_everything(derived_seed(cfg.seed, epoch, worker.rank))  # augmentation, drop path, mixing
        self.ddp_model.train()
        tally = self.train_epoch(epoch)
        metrics = {**self.epoch_stats(tally), "lr": self.lr, "epoch": epoch + 1, "step": self.step}
        if cfg.evaluates(epoch + 1, last_epoch):
            metrics |= self.task.evaluate(self.model, epoch + 1, final=epoch + 1 == last_epoch)
        if worker.rank == 0:
            self.task.epoch_end(self.model, metrics)
        done = self.task.evaluations(wait=False)  # earlier epochs evaluated in the background
        if worker.rank == 0:
            self.task.record([*done, metrics])
        folder = None
        if worker.rank == 0 and cfg.checkpoints(epoch + 1, last_epoch):
            folder = write_checkpoint(self.model, self.optimizer, self.scaler, epoch, self.step, self.task.config,
                                      {**metrics, **self.task.checkpoint_extra()}, self.task.unsent)
            if not self.room_checked:  # the first checkpoint this job writes: its size is known now
                self.room_checked = True
                if note := room_note(folder_bytes(folder), self.task.run_dir, cfg.keep_checkpoints):
                    log.warning(f"[{cfg.kind}] {note}")
        worker.report(metrics, folder, background=cfg.async_checkpoint)  # the worker owns the folder now


def train(task: Task, cfg: JobConfig, worker: Worker) -> None:
    """Run ``task`` on ``worker`` under ``cfg``: the whole per-worker job."""
    with tf32_matmuls(cfg.tf32):
        Loop(task, cfg, worker).run()
