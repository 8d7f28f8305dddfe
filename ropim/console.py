"""What a person sees on the terminal: ``ropim.*`` progress lines, without the libraries' internal chatter.

``quiet_console()`` (called by the ``ropim`` command before Ray or MLflow is imported) drops Ray's per-worker
``(RayTrainWorker pid=…)`` prefix, keeps MLflow's and Ray's own loggers at WARNING, and filters the few lines Ray
and MLflow print about their internals that say nothing about the user's job (``NOISE``). Everything else —
every warning and error about the job — passes through.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys

# Lines about Ray's / MLflow's own machinery, not the user's job (each seen in `make demo` output):
NOISE = re.compile("|".join((
    r"core_worker\.cc:\d+: Actor with class name: 'PreemptionWatcher'",  # Train V2's controller, max_restarts > 0
    r"Failed to query Ray Train Controller actor state",  # placement-group cleaner without the state API
    r"Successfully registered model '|Created version '\d+' of model|Registered model '.+' already exists",  # MLflow
    # prints these on registration; ropim prints the registered URI itself
    r"Token authentication is enabled",  # ray.init's notice on a local head
    r"Reporting training result \d+",  # Ray Train's per-report INFO line
)))
# Warnings Ray logs with a traceback about its own machinery; the line and its traceback are dropped together.
NOISE_WITH_TRACEBACK = re.compile("|".join((
    r"Failed to send resource request for train-",  # Train V2's autoscaling client, a 5 s timeout under CPU load
    r"Exception in thread PlacementGroupCleanerMonitor",  # Train V2's cleaner cannot pick a Ray instance when
    # several run on one machine (it asks the state API without an address); only an aborted run needs it
)))
TRACEBACK_LINE = re.compile(r"Traceback \(most recent call last\)|\s|$")
TRACEBACK_END = re.compile(r"[\w.]+(Error|Exception|Interrupt)\b")


class NoiseFilter(io.TextIOBase):
    """A text stream that writes whole lines to ``stream`` unless they match ``NOISE`` (or
    ``NOISE_WITH_TRACEBACK``, then with the traceback that follows)."""

    def __init__(self, stream) -> None:
        self.stream, self.pending, self.in_traceback = stream, "", False

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if self.keep(line):
                self.stream.write(line + "\n")
        self.stream.flush()
        return len(text)

    def keep(self, line: str) -> bool:
        """Whether ``line`` is shown; follows a dropped warning's traceback to its exception line."""
        if self.in_traceback:
            if TRACEBACK_LINE.match(line):
                return False
            self.in_traceback = False
            if TRACEBACK_END.match(line):
                return False
        if NOISE_WITH_TRACEBACK.search(line):
            self.in_traceback = True
            return False
        return not NOISE.search(line)

    def flush(self) -> None:
        if self.pending and not NOISE.search(self.pending):
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def ensure_logging() -> None:
    """Show ``ropim.*`` INFO lines (progress, resampling) on stderr when nothing else configured logging."""
    logger = logging.getLogger("ropim")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


def quiet_console() -> None:
    """Readable output for a ``ropim`` command: before Ray is imported, no per-worker prefixes; MLflow's and Ray's
    loggers at WARNING; ``NOISE`` lines filtered from this process's stdout and stderr."""
    os.environ.setdefault("RAY_DISABLE_WORKER_LOG_PREFIX", "1")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # read when MLflow configures its loggers
    for name in ("ray", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not isinstance(sys.stdout, NoiseFilter):
        sys.stdout, sys.stderr = NoiseFilter(sys.stdout), NoiseFilter(sys.stderr)
    ensure_logging()
