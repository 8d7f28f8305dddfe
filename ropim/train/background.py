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
process's exit until it ends (its thread is joined then).

The thread is a plain ``threading.Thread``, started when a job is handed over and ended when none is left: a process
forked from a ``ThreadPoolExecutor``'s thread (a DataLoader process of an evaluation) exits with code 1 whatever it
did, since the pool's exit hook in the copied interpreter joins the copied thread, itself; torch's DataLoader takes
that for a crashed worker when the exit reaches it first, and raises in the training loop.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

Metrics = dict[str, float]


class Job:
    """A job handed to ``Background``: its metrics, or what it raised, once ``done``."""

    def __init__(self, run: Callable[[], Metrics]) -> None:
        self.run, self.finished = run, threading.Event()
        self.metrics: Metrics | None = None
        self.error: BaseException | None = None

    def done(self) -> bool:
        return self.finished.is_set()

    def result(self) -> Metrics:
        """The job's metrics, waiting for it; what it raised is raised here."""
        self.finished.wait()
        if self.error is not None:
            raise self.error
        return self.metrics


class Background:
    """Jobs keyed by epoch, run one after another in one thread, at most ``limit`` in flight, collected in epoch
    order."""

    def __init__(self, name: str = "ropim-background", limit: int = 1) -> None:
        self.name, self.limit = name, limit
        self.lock = threading.Lock()  # guards ``queue`` and ``thread``
        self.queue: collections.deque[Job] = collections.deque()  # handed over, not started
        self.thread: threading.Thread | None = None
        self.threads = 0  # threads started: their names' numbers
        self.pending: dict[int, Job] = {}
        self.cancel = threading.Event()  # set by ``close(cancel=True)``: jobs in flight should end

    def cancelled(self) -> bool:
        """Whether the jobs in flight are to end now (a job asks it between its parts)."""
        return self.cancel.is_set()

    def make_room(self) -> float:
        """Wait until fewer than ``limit`` jobs are unfinished (the oldest first); return the seconds waited. Call it
        before making a job's inputs (a copy of the weights), so that no more than ``limit`` copies are held."""
        unfinished = [j for j in self.pending.values() if not j.done()]  # epoch order: the oldest first
        excess = len(unfinished) - self.limit + 1
        if excess <= 0:
            return 0.0
        t0 = time.perf_counter()
        for job in unfinished[:excess]:
            job.finished.wait()
        return time.perf_counter() - t0

    def submit(self, epoch: int, job: Callable[[], Metrics]) -> None:
        """Start ``job`` (a dict of metrics of epoch ``epoch``) after the jobs already submitted, once there is room."""
        self.make_room()
        self.pending[epoch] = Job(job)
        with self.lock:
            self.queue.append(self.pending[epoch])
            if self.thread is None:
                self.thread = threading.Thread(target=self.serve, name=f"{self.name}_{self.threads}")
                self.threads += 1
                self.thread.start()

    def serve(self) -> None:
        """The thread: run the jobs handed over, in order, until none is left."""
        while True:
            with self.lock:
                if not self.queue:
                    self.thread = None
                    return
                job = self.queue.popleft()
            try:
                job.metrics = job.run()
            except BaseException as err:  # noqa: BLE001 — handed to whoever collects the job
                job.error = err
            finally:
                job.finished.set()

    def collect(self, wait: bool = False) -> list[Metrics]:
        """``{"epoch": e, **metrics}`` of each finished job (``wait``: of every job, waiting), in epoch order; a job
        that raised raises here."""
        done = [e for e, j in sorted(self.pending.items()) if wait or j.done()]
        return [{"epoch": e, **self.pending.pop(e).result()} for e in done]

    def close(self, cancel: bool = False) -> None:
        """Wait for the running job (``cancel``: tell it to end first, through ``cancelled``), drop the queued ones,
        end the thread."""
        if cancel:
            self.cancel.set()
        with self.lock:
            self.queue.clear()
            thread = self.thread
        if thread is not None:
            thread.join()
        self.pending.clear()
        self.cancel.clear()
