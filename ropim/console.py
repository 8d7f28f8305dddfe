"""What a person sees on the terminal: ``ropim.*`` progress lines, without the libraries' internal chatter. Each
such line is dropped where it is made, through the library's own settings or a logging filter; no output stream is
replaced, so every other line (and every warning and error about the job) passes as the library wrote it.

``quiet_console()`` (the entry points call it, before Ray or MLflow is imported):

- Ray: no per-worker ``(RayTrainWorker pid=…)`` prefix; its loggers at WARNING; the records it logs about its own
  machinery (``QUIET_RECORDS``, each with the traceback it carries), the traceback of a worker's bad input said in
  one line (``INPUT_ERROR_RECORDS``: the driver ends with that line; Tune's record of a failed trial shows only that
  line, ``ONE_LINE_RECORDS``), the warnings it raises about its own code
  (``QUIET_WARNINGS``), the uncaught exceptions of its helper threads (``QUIET_THREADS``) and the exit its SIGTERM
  handler raises inside a finalizer (``QuietExits``) are dropped in this
  process and, through the job's ``worker_process_setup_hook``, in every Ray worker process of the job (Train's
  controller and Ray Data's split coordinator run there); the C++ lines its workers and raylets print
  (``SKIPPED_LINES``) are skipped by Ray's own log deduplicator. Ray Data's progress bars are turned off per dataset
  (``ropim.data.ingest.quiet``).
- MLflow: loggers at WARNING, no artifact progress bars. The lines its registry prints on every new version are
  muted where ropim registers one (``ropim.tracking.registry``), which prints the registered URI itself.

The progress lines say the time left one way, ``eta_text``; work without steps of its own (an evaluation, a feature
extraction) says its progress through ``Pace``.

The logger names and messages are Ray 2.60's (pinned); tests/test_console.py checks that they still exist there.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable

from ropim.errors import input_line

# {logger: start of the message}: warnings about Ray's own machinery, not the user's job (each seen in `make demo`)
QUIET_RECORDS = {
    # ray.init's notice on a new local cluster: it made and uses a token, as documented in README "Security"
    "ray._private.authentication.authentication_token_setup": "Token authentication is enabled for this Ray cluster",
    # Train V2's placement-group cleaner without the state API (the dashboard)
    "ray.train.v2._internal.execution.controller.placement_group_cleaner":
        "Failed to query Ray Train Controller actor state",
    # Train V2's autoscaling client, a 5 s timeout under CPU load (logged with its traceback)
    "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client":
        "Failed to send resource request for train-",
    # Ray Data, once per process, where a job turned its progress bars off (``ropim.data.ingest.quiet``)
    "ray.data._internal.progress": "Progress bars disabled.",
    # Ray Data, once per epoch of a ray_data ingest (a failed execution's line stays)
    "ray.data._internal.execution.streaming_executor": "✔️  Dataset ",
}
# {logger: start of the message}: Ray Train's worker logs the traceback of whatever the job's function raised, and
# Ray Data (ingest=ray_data) the error of a decode task where its execution aborts and where each split fails; for
# bad input said in one line (``ropim.errors.input_line``: an image that does not decode, a shard cut short)
# the driver ends with that line, so these records (a restarted attempt's again) are dropped; any other error keeps
# them
INPUT_ERROR_RECORDS = {
    "ray.train.v2._internal.util": "Error in training function:",
    "ray.data._internal.execution.streaming_executor_state": "An exception was raised from a task of operator",
    "ray.data._internal.iterator.stream_split_iterator": "Split ",
}
# {logger: start of the message}: Tune logs a failed trial's error with its traceback (Ray's task error around the
# trial's); for bad input said in one line it shows that line instead
ONE_LINE_RECORDS = {"ray.tune.execution.tune_controller": "Trial task failed for trial"}
# {category: start of the message}: Python warnings Ray raises about its own code (Train V2 sets the option)
QUIET_WARNINGS = {DeprecationWarning: "`ExecutionOptions.exclude_resources` is deprecated"}
# Train V2's cleaner thread: it cannot pick a Ray instance when several run on one machine (it asks the state API
# without an address); only an aborted run needs it
QUIET_THREADS = ("PlacementGroupCleanerMonitor",)
# Ray's C++ lines, outside Python logging: Train V2's controller, whose PreemptionWatcher actor has max_restarts > 0;
# the raylet's worker pool (worker_pool.cc), once its Python workers reach 4x its startup concurrency (the node's
# CPUs), which fractional-CPU runs do by design (Train workers at 0.5 CPU, Ray Data's 0.25-CPU decode tasks, 0-CPU
# actors): every such run printed it, about Ray's scheduling, not the job
SKIPPED_LINES = (r"core_worker\.cc:\d+: Actor with class name: 'PreemptionWatcher'"
                 r"|PYTHON worker processes have been started on node: .* the maximum expected startup concurrency")


def eta_text(seconds: float) -> str:
    """Time left, as a progress line says it: minutes up to 2 hours, then hours (a 300-epoch run's ETA in hours)."""
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


class Pace:
    """Progress of long work without steps of its own, as a callback handed the items each piece finished: one line
    through ``say`` per ``every`` seconds (``{what}: done/total images, rate, ETA``); work shorter than that says
    nothing."""

    def __init__(self, what: str, total: int, say: Callable[[str], object], every: float = 30.0) -> None:
        self.what, self.total, self.say, self.every = what, total, say, every
        self.done = 0
        self.start = self.last = time.monotonic()

    def __call__(self, finished: int) -> None:
        self.done += finished
        now = time.monotonic()
        if now - self.last < self.every or self.done >= self.total:
            return
        self.last = now
        rate = self.done / (now - self.start)
        self.say(f"{self.what}: {self.done}/{self.total} images {rate:.1f} img/s ETA "
                 f"{eta_text((self.total - self.done) / rate)}")


class DropRecords(logging.Filter):
    """Drops the records whose message starts with ``start`` (a record's traceback goes with it); with ``handling``,
    only those about an exception it accepts (the record's own, or the one handled where it is logged)."""

    def __init__(self, start: str, handling: Callable[[BaseException | None], bool] | None = None) -> None:
        super().__init__()
        self.start = start
        self.handling = handling

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self.start):
            return True
        about = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return self.handling is not None and not self.handling(about)


def raised(err: BaseException | None) -> BaseException | None:
    """The exception a Ray task raised, taken out of Ray's task errors around it (``err`` itself otherwise)."""
    while getattr(err, "cause", None) is not None:
        err = err.cause
    return err


def said_in_one_line(err: BaseException | None) -> bool:
    """Whether ``err`` (or what a Ray task raised inside it) is bad input said in one line
    (``ropim.errors.input_line``)."""
    return bool(input_line(raised(err)))


class OneLine(logging.Filter):
    """Shows a record whose message starts with ``start`` and that carries bad input said in one line (its
    ``exc_info``, or a Ray task error around it) as its message and that line, without the traceback."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        line = input_line(raised(record.exc_info[1])) if record.exc_info else None
        if line and record.getMessage().startswith(self.start):
            record.msg, record.args = f"{record.getMessage()}: {line}", ()
            record.exc_info = record.exc_text = None
        return True


class QuietExits:
    """A ``sys.unraisablehook`` that drops a ``SystemExit`` raised where Python cannot raise it (Ray's SIGTERM handler
    of a worker process that Ray stops, run inside a finalizer: ``Exception ignored in: <function WeakSet…>`` and
    its traceback, in the output of a sweep that succeeded) and hands every other one to the hook it replaced."""

    def __init__(self, previous) -> None:
        self.previous = previous

    def __call__(self, unraisable) -> None:
        if not (isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, SystemExit)):
            self.previous(unraisable)


class QuietThreads:
    """A ``threading.excepthook`` that drops the uncaught exceptions of ``QUIET_THREADS`` and hands every other one to
    the hook it replaced."""

    def __init__(self, previous) -> None:
        self.previous = previous

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        if args.thread is None or args.thread.name not in QUIET_THREADS:
            self.previous(args)


def quiet_ray_internals() -> None:
    """Drop ``QUIET_RECORDS``, ``QUIET_WARNINGS`` and the exceptions of ``QUIET_THREADS`` in this process: the driver,
    or a Ray worker process (the job's ``worker_process_setup_hook``, see ``job_runtime_env``)."""
    for category, start in QUIET_WARNINGS.items():
        warnings.filterwarnings("ignore", message=re.escape(start), category=category)
    for records, handling in ((QUIET_RECORDS, None), (INPUT_ERROR_RECORDS, said_in_one_line)):
        for name, start in records.items():
            logger = logging.getLogger(name)
            if not any(isinstance(f, DropRecords) for f in logger.filters):
                logger.addFilter(DropRecords(start, handling))
    for name, start in ONE_LINE_RECORDS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLine) for f in logger.filters):
            logger.addFilter(OneLine(start))
    if not isinstance(threading.excepthook, QuietThreads):
        threading.excepthook = QuietThreads(threading.excepthook)
    if not isinstance(sys.unraisablehook, QuietExits):
        sys.unraisablehook = QuietExits(sys.unraisablehook)


def job_runtime_env(runtime_env: dict | None) -> dict:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: the job's runtime env, with ``quiet_ray_internals`` run first in each of its
    worker processes (a setup hook of the user's own wins)."""
    return {"worker_process_setup_hook": f"{__name__}.quiet_ray_internals", **(runtime_env or {})}


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
    """Readable output for a ``ropim`` command (see the module's docstring); call it before Ray is imported, which
    reads its settings then. A setting already in the environment wins."""
    for name, value in (("RAY_DISABLE_WORKER_LOG_PREFIX", "1"), ("RAY_DEDUP_LOGS_SKIP_REGEX", SKIPPED_LINES),
                        ("RAY_RUNTIME_ENV_HOOK", f"{__name__}.job_runtime_env"),
                        ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false"),
                        ("MLFLOW_LOGGING_LEVEL", "WARNING")):  # read when MLflow configures its loggers
        os.environ.setdefault(name, value)
    for name in ("ray", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    quiet_ray_internals()
    ensure_logging()
