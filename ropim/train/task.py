"""What the one training loop (``ropim.train.loop``) talks to: the ``Worker`` it runs on (a Ray Train worker or this
process, ``ropim.train.runtime``), and the ``Task`` a job supplies with its ``EpochData``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from ropim.train.checkpoint import Candidates


class Worker(Protocol):
    """Where the loop runs: one Ray Train worker, or this process (``ropim.train.runtime``)."""

    rank: int
    world: int
    device: torch.device

    def restorable(self) -> Candidates:
        """The run's complete checkpoints, newest first: (name, a context giving it as a local folder)."""

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def gather(self, values: torch.Tensor) -> torch.Tensor: ...

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


class Task(Protocol):
    """What a job supplies to the loop."""

    loss_name: str  # the epoch's mean-loss metric: "loss" (pretraining) or "train_loss" (fine-tuning)
    config: dict  # the job's config, stored in every checkpoint as config.json
    run_dir: str  # the run's folder (local path or URI): where a stop is recorded (``ropim.train.guard``)

    def build(self, worker: Worker) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model on ``worker.device`` (identical on every rank) and its optimizer."""

    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        """This worker's share of the training data in micro batches of ``micro_batch``."""

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        """(mean loss, images) of one micro batch at optimizer step ``step``; ``model`` may be DDP-wrapped."""

    def evaluate(self, model: torch.nn.Module, epoch: int, final: bool) -> dict[str, float]:
        """Metrics of epoch ``epoch`` (1-based) when due; called on every rank. Unless ``final`` (the job's last
        epoch), a task may start the evaluation in the background and return {} (``evaluations`` collects it)."""

    def evaluations(self, wait: bool) -> list[dict]:
        """Background evaluations finished so far (``wait``: all, waiting), as ``{"epoch": e, **metrics}``."""

    def epoch_end(self, model: torch.nn.Module, metrics: dict) -> None:
        """Rank 0, after each epoch: the progress line, pictures."""

    def record(self, epochs: list[dict]) -> None:
        """Rank 0: store the metrics of ``epochs`` (MLflow), once the checkpoint that holds them is reported — so
        an epoch retrained after a crash is recorded once."""

    def checkpoint_extra(self) -> dict:
        """JSON-able extras stored in the checkpoint's metrics.json (e.g. the last confusion matrix)."""

