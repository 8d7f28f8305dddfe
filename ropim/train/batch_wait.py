"""A line when a worker has waited long for its next batch. A data pipeline that stalls (Ray Data's read tasks left
no CPU, a storage that stopped answering, DataLoader workers stuck) otherwise shows only as step lines that stop
coming, until Ray's 30-minute no-progress timeout or for ever."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator

log = logging.getLogger("ropim.train")
WAIT_S = 60.0  # a wait this long for one batch is said, and again every as long while it lasts
STALLED = ("the data pipeline is not keeping up: its readers and decoders are short of CPUs (`ray status`: CPUs the "
           "workers leave free), slow, or stalled on storage")


def waits_said(batches: Iterable, line: Callable[[float], str], after_s: float | None = None) -> Iterator:
    """``batches`` as they come; while a wait for the next one lasts ``after_s`` seconds (None: ``WAIT_S``; and each
    ``after_s`` after), a watcher thread logs ``line(seconds waited)`` as a warning. The thread ends with the
    iteration (or when the iterator is closed or dropped)."""
    after_s = after_s or WAIT_S
    since: list[float | None] = [None]
    done = threading.Event()

    def watch() -> None:
        said, seen = 0, None
        while not done.wait(min(after_s / 4, 5.0)):
            started = since[0]
            if started != seen:  # another wait (or none): nothing said of it yet
                said, seen = 0, started
            if started is not None and (waited := time.monotonic() - started) >= (said + 1) * after_s:
                said = int(waited // after_s)
                log.warning(line(waited))

    watcher = threading.Thread(target=watch, name="ropim-batch-wait", daemon=True)
    watcher.start()
    it = iter(batches)
    try:
        while True:
            since[0] = time.monotonic()
            batch = next(it, StopIteration)
            since[0] = None
            if batch is StopIteration:
                return
            yield batch
    finally:
        done.set()
        watcher.join()
