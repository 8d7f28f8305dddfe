"""The training loop's ``Worker`` on a Ray Train worker (``on_ray``, Ray Train's entry point): its rank, device and
threads, checkpoints restored and reported through Ray Train, values gathered over the job's process group."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from ropim.train.checkpoint import ROOM, NoRoom, full
from ropim.train.collectives import gathered, gathered_on_first, summed


class DropTrainReportLines(logging.Filter):
    """Drops Ray Train's per-report INFO line ("Reporting training result N: TrainingReport(...)"), written once
    per worker per report by a logger that ``LoggingConfig`` does not reach; the loop prints its own progress."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Reporting training result")


class RayWorker:
    """The loop's view of a Ray Train worker: its intra-op threads are the CPUs it was given (``cpus_per_worker``,
    at least 1), whatever ``OMP_NUM_THREADS`` the environment holds, so that a run computes the same numbers on any
    shell of the same machine."""

    def __init__(self) -> None:
        import ray
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.local_world = ctx.get_local_world_size()  # the workers on this node
        self.device = ray.train.torch.get_device()
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU") or 1
        torch.set_num_threads(max(1, math.floor(cpus)))
        for handler in logging.getLogger().handlers:
            handler.addFilter(DropTrainReportLines())

    def restorable(self) -> Iterator[tuple[str, contextlib.AbstractContextManager[str | Path]]]:
        """The run's latest committed checkpoint, then (only when it cannot be loaded) the earlier ones Ray keeps."""
        import ray.train

        latest = ray.train.get_checkpoint()
        if latest is None:
            return
        yield latest.path, latest.as_directory()
        reported = ray.train.get_all_reported_checkpoints(
            consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=10)
        earlier = [r for r in reported if r.checkpoint.path != latest.path]
        for r in sorted(earlier, key=lambda r: (r.metrics or {}).get("step", 0), reverse=True):
            yield r.checkpoint.path, r.checkpoint.as_directory()

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        import ray.train.torch

        return ray.train.torch.prepare_model(model, move_to_device=False)

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        return gathered(values, self.world, self.device)

    def gather_to_first(self, values: torch.Tensor) -> torch.Tensor | None:
        return gathered_on_first(values, self.rank, self.world, self.device)

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        return summed(values, self.world, self.device)

    def report(self, metrics: dict, folder: Path | None, background: bool = False) -> None:
        """Report the epoch; a checkpoint ``folder`` is uploaded to the run's storage and deleted. By default this
        returns once Ray Train has committed it (``ray.train.report`` returns after the upload, the controller
        registers it a poll later: ``ropim.train.commit_poll``), so a worker lost afterwards loses at most the epochs
        since. With ``background``, Ray uploads it while training goes on; a worker lost before Ray registers it
        restarts the run one checkpoint further back (``store.log_epochs`` records no epoch twice)."""
        import ray.train

        checkpoint = ray.train.Checkpoint.from_directory(str(folder)) if folder else None
        mode = ray.train.CheckpointUploadMode.ASYNC if background else ray.train.CheckpointUploadMode.SYNC
        try:
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=mode,
                             delete_local_checkpoint_after_upload=folder is not None)
        except Exception as err:
            if not full(err):
                raise
            raise NoRoom(f"no space left in the run's storage_path for epoch {metrics['epoch']}'s checkpoint: free "
                         f"space there, {ROOM}") from None
        if folder is not None and not background:
            ray.train.get_all_reported_checkpoints(consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED)


def on_ray(fn: Callable[[dict, RayWorker], None], config: dict) -> None:
    """Ray Train's entry point: ``fn`` on this Ray Train worker."""
    fn(config, RayWorker())
