"""How soon Ray Train registers a checkpoint.

Train's controller polls its workers every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (Ray's default: 2 s) and registers
a reported checkpoint at the poll after the report; a checkpoint report waits for that commit
(``ropim.train.ray_worker.RayWorker.report``), so that a worker lost later loses at most the epochs since. On epochs of
seconds that wait was as long as the training: the digits demo's epochs took 4.1 s, 2.2 s of them training (docs
"Speed"). A job of at most ``MAX_WORKERS`` workers has the controller poll every ``POLL_S`` instead: each poll asks
every worker once, few enough at that size. A larger job keeps Ray's interval (its epochs take minutes), and an
interval the environment sets wins.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

POLL_VARIABLE = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # Train hands the driver's value on to its controller
POLL_S = 0.25
MAX_WORKERS = 16


@contextmanager
def quick_commits(num_workers: int) -> Iterator[None]:
    """While a trainer of ``num_workers`` workers runs: its controller polls every ``POLL_S`` seconds, unless the
    job is larger than ``MAX_WORKERS`` or the environment sets the interval."""
    if POLL_VARIABLE in os.environ or num_workers > MAX_WORKERS:
        yield
        return
    os.environ[POLL_VARIABLE] = str(POLL_S)
    try:
        yield
    finally:
        os.environ.pop(POLL_VARIABLE, None)
