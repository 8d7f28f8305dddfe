"""The pieces of the 2-rank loop tests (``test_epoch_end``, ``test_restore_agreement``): a toy task whose workers hold
unequal numbers of batches, and one process of a 2-rank loop on gloo (imports only torch and the loop, so a spawned
process starts quickly)."""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from support import gloo_rank

from ropim.train.collectives import gathered, gathered_on_first, summed
from ropim.train.job import JobConfig
from ropim.train.loop import Loop
from ropim.train.task import EpochData


@dataclass(frozen=True)
class ToyJob(JobConfig):
    """A job of the toy task: its peak rate, the batch and the micro batches per step."""

    NAME = "toy"
    lr: float = 0.1
    global_batch_size: int = 4
    accum_steps: int = 2


def toy_loop_config(epochs: int = 2, global_batch_size: int = 4, log_every: int = 100) -> ToyJob:
    """Plain SGD-like settings: fp32, no warm-up, 2 micro batches per step, an evaluation every epoch."""
    return ToyJob(epochs=epochs, global_batch_size=global_batch_size, min_lr=0.1, warmup_epochs=0, eval_every=1,
                  log_every=log_every)


class ToyTask:
    """A linear model on fixed random batches: ``batches[rank]`` micro batches a worker's epoch really yields, while
    its data lists ``listed`` steps (as Ray Data's equal split does before bad images are skipped)."""

    loss_name = "loss"
    epoch_period: float | None = None  # what the Task base measures between epoch lines (the step lines' ETA)

    def __init__(self, batches: dict[int, int], listed: int, run_dir: str, fail_at: int | None = None) -> None:
        self.batches, self.listed, self.run_dir, self.fail_at = batches, listed, run_dir, fail_at
        self.config: dict = {}
        self.unsent: list[dict] = []  # records the store has not taken (none: this task records nothing)
        self.clean: list[bool] = []  # per epoch, after training: no gradient left on any parameter

    def build(self, worker) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        self.model = torch.nn.Linear(4, 1)
        return self.model, torch.optim.SGD(self.model.parameters(), lr=0.1)

    def data(self, worker, micro_batch: int) -> EpochData:
        def batches(epoch: int):
            g = torch.Generator().manual_seed(100 * epoch + worker.rank)
            return iter([torch.randn(micro_batch, 4, generator=g) for _ in range(self.batches[worker.rank])])

        return EpochData(batches, self.listed)

    def before_step(self, step: int) -> None:
        pass

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        if step == self.fail_at:
            raise StopIteration("raised by the task's own code, not the end of the data")
        return (model(batch) - 1).pow(2).mean(), batch.shape[0]

    def evaluate(self, model: torch.nn.Module, epoch: int, final: bool) -> dict[str, float]:
        self.clean.append(all(p.grad is None for p in model.parameters()))
        return {}

    def evaluations(self, wait: bool) -> list[dict]:
        return []

    def epoch_end(self, model: torch.nn.Module, metrics: dict) -> None:
        pass

    def record(self, epochs: list[dict], last: bool = False) -> None:
        pass

    def checkpoint_extra(self) -> dict:
        return {}


class GlooWorker:
    """A worker of a 2-process gloo group: DDP and the gathers of Ray Train's CPU workers (``ropim.train.collectives``);
    checkpoints dropped."""

    device = torch.device("cpu")

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world, self.local_world = rank, world, world  # one machine
        self.steps: list[int] = []  # the step count each epoch's report carried

    def restorable(self):
        return iter(())

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.parallel.DistributedDataParallel(model)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        return gathered(values, self.world, self.device)

    def gather_to_first(self, values: torch.Tensor) -> torch.Tensor | None:
        return gathered_on_first(values, self.rank, self.world, self.device)

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        return summed(values, self.world, self.device)

    def report(self, metrics: dict, folder: Path | None, background: bool = False) -> None:
        self.steps.append(metrics["step"])
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def two_rank_loop(rank: int, init: str, batches: dict[int, int], listed: int, run_dir: str, out) -> None:
    """Rank ``rank`` of 2: two epochs of ``ToyTask``; puts (rank, steps per report, clean, weights as floats) or the
    error."""
    with gloo_rank(rank, init, out, blanks=2):
        task, worker = ToyTask(batches, listed, run_dir), GlooWorker(rank, 2)
        loop = Loop(task, toy_loop_config(global_batch_size=8), worker)
        loop.run()
        weights = torch.cat([p.detach().flatten() for p in task.model.parameters()]).tolist()  # no tensor: no fd
        out.put((rank, worker.steps, task.clean, weights))


class OneSidedRestore(GlooWorker):
    """A worker of a run with two checkpoints, the latest of which only rank 0 can read (rank 1's read failed)."""

    def __init__(self, rank: int, world: int, latest: Path, earlier: Path) -> None:
        super().__init__(rank, world)
        self.latest, self.earlier = latest if rank == 0 else latest / "gone", earlier

    def restorable(self):
        return iter([(name, contextlib.nullcontext(folder)) for name, folder in (("latest", self.latest),
                                                                                 ("earlier", self.earlier))])


def two_rank_restore(rank: int, init: str, latest: str, earlier: str, run_dir: str, out) -> None:
    """Rank ``rank`` of 2 builds the toy loop from ``OneSidedRestore``'s checkpoints; puts (rank, what it raised)."""
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        Loop(ToyTask({0: 2, 1: 2}, 2, run_dir), toy_loop_config(global_batch_size=8),
             OneSidedRestore(rank, 2, Path(latest), Path(earlier)))
        out.put((rank, "no error"))
    except Exception as err:  # noqa: BLE001 — the test reads what each worker raised
        out.put((rank, f"{type(err).__name__}: {err}"))
    finally:
        torch.distributed.destroy_process_group()
