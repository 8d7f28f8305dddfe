"""Work that runs beside the training loop in one background thread (evaluations of earlier epochs), so that the
loop never waits for it while it keeps up; the loop collects what finished at its epoch boundaries, and waits only
at the end.

At most ``limit`` jobs are in flight (running or queued): one due while that many are still unfinished waits for the
oldest first (``make_room``). Without the bound, evaluations slower than the epochs between them piled up for the
rest of the run, each holding a copy of the encoder (a 60-epoch run evaluated every epoch held 45 copies at its end,
+9 MiB of memory per epoch on the digits, 330 MiB per copy for a ViT-B) and the job's end waited for all of them.

A job handed over must not use torch's global random generator (the loop's epochs draw from it: a thread drawing
in the middle of an epoch would change that epoch's augmentation and drop path) and must own its inputs (a copy of
the weights, not the live model). A long job should ask ``cancelled`` between its parts: a job that stops (a stop
signal, a failure) drops what is in flight (``close(cancel=True)``), and a running job that never asks holds the
process's exit until it ends (the pool's thread is joined then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor


class Background:
    """Jobs keyed by epoch, run one after another in one thread, at most ``limit`` in flight, collected in epoch
    order."""

    def __init__(self, name: str = "ropim-background", limit: int = 1) -> None:
        self.name, self.limit = name, limit
        self.pool: ThreadPoolExecutor | None = None
        self.pending: dict[int, Future] = {}
        self.cancel = threading.Event()  # set by ``close(cancel=True)``: jobs in flight should end

    def cancelled(self) -> bool:
        """Whether the jobs in flight are to end now (a job asks it between its parts)."""
        return self.cancel.is_set()

    def make_room(self) -> float:
        """Wait until fewer than ``limit`` jobs are unfinished (the oldest first); return the seconds waited. Call it
        before making a job's inputs (a copy of the weights), so that no more than ``limit`` copies are held."""
        unfinished = [f for f in self.pending.values() if not f.done()]  # epoch order: the oldest first
        excess = len(unfinished) - self.limit + 1
        if excess <= 0:
            return 0.0
        t0 = time.perf_counter()
        futures.wait(unfinished[:excess])
        return time.perf_counter() - t0

    def submit(self, epoch: int, job: Callable[[], dict[str, float]]) -> None:
        """Start ``job`` (a dict of metrics of epoch ``epoch``) after the jobs already submitted, once there is room."""
        self.make_room()
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

    def close(self, cancel: bool = False) -> None:
        """Wait for the running job (``cancel``: tell it to end first, through ``cancelled``), drop the queued ones,
        release the thread."""
        if cancel:
            self.cancel.set()
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
        self.pending.clear()
        self.cancel.clear()
