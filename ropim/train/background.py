"""Work that runs beside the training loop in one background thread (evaluations of earlier epochs), so that the
loop never waits for it; the loop collects what finished at its epoch boundaries, and waits only at the end.

A job handed over must not use torch's global random generator (the loop's epochs draw from it: a thread drawing
in the middle of an epoch would change that epoch's augmentation and drop path) and must own its inputs (a copy of
the weights, not the live model).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class Background:
    """Jobs keyed by epoch, run one after another in one thread, collected in epoch order."""

    def __init__(self, name: str = "ropim-background") -> None:
        self.name = name
        self.pool: ThreadPoolExecutor | None = None
        self.pending: dict[int, Future] = {}

    def submit(self, epoch: int, job: Callable[[], dict[str, float]]) -> None:
        """Start ``job`` (a dict of metrics of epoch ``epoch``) after the jobs already submitted."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self.pending[epoch] = self.pool.submit(job)

    @property
    def running(self) -> int:
        """Jobs submitted and not yet collected."""
        return len(self.pending)

    def collect(self, wait: bool = False) -> list[dict[str, float]]:
        """``{"epoch": e, **metrics}`` of each finished job (``wait``: of every job, waiting), in epoch order; a job
        that raised raises here."""
        done = [e for e, f in sorted(self.pending.items()) if wait or f.done()]
        return [{"epoch": e, **self.pending.pop(e).result()} for e in done]

    def close(self) -> None:
        """Wait for the running job, drop the queued ones, release the thread."""
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.pending.clear()
