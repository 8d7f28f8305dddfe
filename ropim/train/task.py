"""What the one training loop (``ropim.train.loop``) talks to: the ``Worker`` it runs on (a Ray Train worker or this
process, ``ropim.train.runtime``), and the ``Task`` a job supplies (a base class with the hooks' defaults) with its
``EpochData``."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import psutil
import torch
from torch.utils.data import DataLoader

from ropim.console import Pace, eta_text
from ropim.data.blocks import holding_note, mixing_note
from ropim.data.sampling import train_sampler
from ropim.errors import ConfigError, first_line
from ropim.tracking import registry, store
from ropim.train.checkpoint import Candidates
from ropim.train.job import JobConfig

log = logging.getLogger("ropim.train")


class Worker(Protocol):
    """Where the loop runs: one Ray Train worker, or this process (``ropim.train.runtime``)."""

    rank: int
    world: int
    local_world: int  # the workers on this node (this one included)
    device: torch.device

    def restorable(self) -> Candidates:
        """The run's complete checkpoints, newest first: (name, a context giving it as a local folder)."""

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        """Every worker's ``values`` (same shape on each), stacked (world, …) on CPU on every worker."""

    def gather_to_first(self, values: torch.Tensor) -> torch.Tensor | None:
        """``gather`` onto rank 0 alone: the others get None (and never hold the others' values)."""

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        """Every worker's ``values`` summed, on CPU on every worker (counts: one tensor's size exchanged)."""

    def report(self, metrics: dict, folder: Path | None, background: bool = False) -> None:
        """Report the epoch; ``folder`` (a checkpoint, rank 0) becomes the worker's: persisted, then deleted; with
        ``background``, persisted while training goes on where the worker can."""


@dataclass
class EpochData:
    """A worker's batches: ``batches(epoch)`` yields the micro batches of ``steps`` optimizer steps."""

    batches: Callable[[int], Iterator]
    steps: int
    # extra per-epoch statistics: name -> (read this worker's value, "sum" or "max" over workers)
    stats: dict[str, tuple[Callable[[], float], str]] = field(default_factory=dict)


class Task(ABC):
    """A job as the loop sees it: the model, the batches, batch → loss, and hooks with defaults (evaluation, what
    rank 0 logs and records). A job's task names its config class (``CONFIG``) and defines ``build``, ``data`` and
    ``loss``; the loop offers it the run's step count and its autocast dtype before the first epoch."""

    CONFIG: ClassVar[type[JobConfig]]
    loss_name = "loss"  # the epoch's mean-loss metric: "loss" (pretraining) or "train_loss" (fine-tuning)

    def __init__(self, config: dict, worker: Worker) -> None:
        self.config = config["cfg"]  # the job's config, stored in every checkpoint as config.json
        self.cfg = self.CONFIG.from_dict(self.config)
        # the MLflow run, its store, and the run's folder (local path or URI): where a stop is recorded
        self.run_id, self.tracking, self.run_dir = config["run_id"], config["tracking_uri"], config["run_dir"]
        self.worker = worker
        self.extra: dict = {}  # JSON-able extras for the next checkpoint's metrics.json (e.g. the last evaluation)
        self.total_steps = 0  # set by the loop: optimizer steps of the whole run (a schedule's length)
        self.amp_dtype: torch.dtype | None = None  # set by the loop: its autocast dtype (None: fp32)
        self.memory_shown = False  # the epoch line said what a worker needs in memory
        self.starving_shown = False  # the job said once that its workers wait for data
        self.first_epoch_line: tuple[int, float] | None = None  # rank 0: this process's first (epoch, time)
        self.epoch_period: float | None = None  # rank 0: mean seconds from one epoch line to the next in this process
        self.unsent: list[dict] = []  # rank 0: epoch records the tracking store has not taken yet (``record``)
        self.asked: tuple[int, bool] = (0, True)  # rank 0: the last epoch end that asked the store, and its answer

    @classmethod
    def inputs(cls, cfg: JobConfig) -> tuple[dict, dict | None]:
        """On the driver, before the workers start: what their config adds, and the Ray datasets they read (none)."""
        return {}, None

    @abstractmethod
    def build(self, worker: Worker) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model on ``worker.device`` (identical on every rank) and its optimizer."""

    @abstractmethod
    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        """This worker's share of the training data in micro batches of ``micro_batch``."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        """(mean loss, images) of one micro batch at optimizer step ``step``; ``model`` may be DDP-wrapped."""

    def before_step(self, step: int) -> None:
        """Called once before the micro batches of optimizer step ``step`` (e.g. to move a momentum encoder)."""
        return None

    def evaluate(self, model: torch.nn.Module, epoch: int, final: bool) -> dict[str, float]:
        """Metrics of epoch ``epoch`` (1-based) when due; called on every rank. Unless ``final`` (the job's last
        epoch), a task may start the evaluation in the background and return {} (``evaluations`` collects it)."""
        return {}

    def resumed(self, model: torch.nn.Module, epoch: int) -> None:
        """Called on every rank once the checkpoint of epoch ``epoch`` (1-based) is restored, before training goes on
        (e.g. to evaluate that epoch again when a stop cut its evaluation short)."""
        return None

    def evaluations(self, wait: bool) -> list[dict]:
        """Background evaluations finished so far (``wait``: all, waiting), as ``{"epoch": e, **metrics}``."""
        return []

    def drop_evaluations(self) -> None:
        """The loop is unwinding (a stop signal, a failure): end the background evaluations now, unrecorded."""
        return None

    @abstractmethod
    def epoch_end(self, model: torch.nn.Module, metrics: dict) -> None:
        """Rank 0, after each epoch: the progress line, pictures."""

    def store_answers(self, epoch: int) -> bool:
        """Rank 0: whether the tracking store answers at the end of epoch ``epoch``, asked once per epoch end (its
        pictures and its records share the answer): one short request (``store.answers``), where a call to a
        server that is down waits out MLflow's own retries (about 4 minutes with its defaults)."""
        if self.asked[0] != epoch:
            self.asked = (epoch, store.answers(self.tracking))
        return self.asked[1]

    def record(self, epochs: list[dict], last: bool = False) -> None:
        """Rank 0: store the metrics of ``epochs`` in MLflow as each epoch ends, before its checkpoint uploads; an
        epoch trained again after a restart keeps its first record (``store.log_epochs``). A store that does not
        answer (``store_answers``) or does not take them does not stop training: they are kept in ``unsent`` (and in
        each checkpoint meanwhile) and sent with the first epoch's whose end finds the store answering, one line
        when that starts and one when they are sent; the job's ``last`` record is sent whatever the answer and
        raises, so that the run is not finished without them."""
        batch = [*self.unsent, *epochs]
        if not batch:
            return
        if not last and not self.store_answers(batch[-1]["epoch"]):
            self.keep(batch, f"no answer from {self.tracking}")
            return
        try:
            store.log_epochs(self.run_id, batch, self.tracking)
        except store.TrackingError as err:  # a server down, a store locked past the retries
            if last:
                raise
            self.keep(batch, first_line(err))
            return
        if self.unsent:
            first, end = self.unsent[0]["epoch"], self.unsent[-1]["epoch"]
            log.info(f"[{self.cfg.kind}] the tracking store took the {len(self.unsent)} record(s) it had not, of "
                     + (f"epoch {first}" if first == end else f"epochs {first}–{end}"))
        self.unsent = []

    def keep(self, batch: list[dict], why: str) -> None:
        """Rank 0: the records ``batch`` the store did not take, kept for the next epoch's end; said once."""
        if not self.unsent:
            log.warning(f"[{self.cfg.kind}] the tracking store did not take epoch {batch[-1]['epoch']}'s metrics "
                        f"({why}): training goes on, and they are sent with the next epoch's (each checkpoint holds "
                        "them meanwhile)")
        self.unsent = batch

    def checkpoint_extra(self) -> dict:
        """JSON-able extras stored in the checkpoint's metrics.json (``extra``)."""
        return self.extra

    def log_epoch(self, metrics: dict, *shown: str) -> None:
        """Rank 0's line of an epoch: ``[kind] epoch e/n``, what the job shows of it (``shown``), speed and ETA; the
        job's first also what a worker needs in memory (the largest worker's peak resident memory so far). The ETA
        is the epochs left × the mean time from one epoch line to the next in this process, so that evaluations,
        checkpoints and pictures count (the process's first line: its epoch's training time)."""
        cfg, epoch, now = self.cfg, metrics["epoch"], time.monotonic()
        if self.first_epoch_line is None:
            self.first_epoch_line = (epoch, now)
        first, at = self.first_epoch_line
        if epoch > first:
            self.epoch_period = (now - at) / (epoch - first)
        left = eta_text((cfg.epochs - epoch) * (self.epoch_period or metrics["epoch_time_s"]))
        memory = "" if self.memory_shown else f", peak RSS per worker {metrics['peak_rss_mb'] / 1024:.2f} GiB"
        self.memory_shown = True
        log.info(f"[{cfg.kind}] epoch {epoch}/{cfg.epochs} {' '.join(shown)} {metrics['img_per_s']:.1f} img/s "
                 f"{metrics['epoch_time_s']:.1f} s ETA {left}{memory}")
        if not self.starving_shown and (note := starving_note(cfg, metrics)):
            self.starving_shown = True
            log.warning(f"[{cfg.kind}] epoch {epoch}: {note} (said once)")

    def eval_pace(self, epoch: int, share: int) -> Pace | None:
        """Rank 0: the progress of epoch ``epoch``'s val evaluation over its ``share`` of the images (each worker
        evaluates one), a line every 30 s of a long one; None on the other ranks."""
        if self.worker.rank != 0:
            return None
        return Pace(f"[{self.cfg.kind}] epoch {epoch} val, rank 0's share", share, log.info)

    def sharded(self, dataset, micro_batch: int,
                stats: dict[str, tuple[Callable[[], float], str]] | None = None) -> EpochData:
        """This worker's share of a map-style ``dataset``: a seeded order (``ropim.data.sampling.train_sampler``,
        reshuffled per epoch, ``drop_last``) and a DataLoader of the job's ``dataloader_workers`` processes (started
        each epoch); ``stats`` as ``EpochData``'s."""
        cfg, worker = self.cfg, self.worker
        processes = cfg.dataloader_workers
        sampler = train_sampler(dataset, worker.world, worker.rank, cfg.seed, micro_batch, processes)
        if worker.rank == 0 and (note := mixing_note(dataset)):
            log.warning(f"[{cfg.kind}] {note}")
        if worker.rank == 0 and (note := holding_note(dataset, processes, worker.local_world,
                                                       psutil.virtual_memory().total)):
            log.warning(f"[{cfg.kind}] {note}")
        # processes started anew each epoch: seeded from the loop's (seed, epoch, rank), so a resumed run augments
        # as the uninterrupted one does (persistent ones keep the seed of the job's first epoch)
        loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True, num_workers=processes,
                            pin_memory=worker.device.type == "cuda" and cfg.pin_memory)
        if len(loader) < 1:
            raise ConfigError(f"{cfg.BATCH}={cfg.batch}: larger than the training split on each worker")
        if processes > 0 and hasattr(dataset, "bad"):  # the loader's processes skip bad images: count them here
            dataset.bad.share(len(dataset))

        def batches(epoch: int) -> Iterator:
            sampler.set_epoch(epoch)
            return iter(loader)

        return EpochData(batches, epoch_steps(len(loader), len(dataset), cfg), stats or {})


def epoch_steps(micro_batches: int, items: int, cfg: JobConfig) -> int:
    """Optimizer steps of an epoch over ``items`` training items when a worker has ``micro_batches``: at most
    ``items // cfg.batch``, so that a worker count not dividing the global batch (an elastic restart on fewer
    nodes) gives the step count, and so the schedule, of the run's own."""
    return min(micro_batches // cfg.accum_steps, items // cfg.batch)


class EncoderTask(Task):
    """A task that starts from an encoder: its weights and config (the version the driver pinned) loaded on the
    worker."""

    def __init__(self, config: dict, worker: Worker) -> None:
        super().__init__(config, worker)
        self.state, self.enc_cfg = registry.load_encoder_files(self.cfg.encoder, self.tracking)


STARVING_SHARE, STARVING_S = 0.3, 10.0  # an epoch's share of time waiting for batches, and its seconds, said


def starving_note(cfg: JobConfig, metrics: dict) -> str | None:
    """What to do when the workers waited for their batches for ``STARVING_SHARE`` of an epoch (and at least
    ``STARVING_S`` seconds: not a smoke run's start-up): the images decode slower than the model trains; else None."""
    share = metrics.get("data_wait_share", 0.0)
    if share < STARVING_SHARE or share * metrics["epoch_time_s"] < STARVING_S:
        return None
    said = f"the workers waited for their images {100 * share:.0f}% of the epoch (data_wait_share in MLflow)"
    if getattr(cfg, "ingest", "torch") == "ray_data":
        return (f"{said}: Ray Data's decode tasks do not keep up; leave them more of the cluster's CPUs (a smaller "
                f"--cpus_per_worker, now {cfg.cpus_per_worker:g}) or use --ingest torch with --dataloader_workers")
    return (f"{said}: the images decode slower than the model trains; decode in more processes: --dataloader_workers "
            f"(now {cfg.dataloader_workers}; each worker needs the CPUs for them: --cpus_per_worker, now "
            f"{cfg.cpus_per_worker:g})")


def percents(metrics: dict, *keys: str) -> list[str]:
    """``key value%`` of each of ``keys`` that ``metrics`` holds (an evaluation's top-1, mIoU, …)."""
    return [f"{k} {metrics[k]:.2f}%" for k in keys if k in metrics]


def bad_images(dataset) -> tuple[Callable[[], float], str]:
    """The epoch statistic of the images ``dataset`` skipped as undecodable, summed over the workers."""
    return lambda: getattr(getattr(dataset, "bad", None), "count", 0), "sum"
