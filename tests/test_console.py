"""What the terminal shows: Ray's and MLflow's internal lines dropped where they are made (the libraries' own
settings, logging filters), every other line (and the job's errors) kept; no output stream replaced."""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import logging
import os
import re
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.utils.logging_utils import eprint

from ropim import console
from ropim.data.decode import BadImageError
from ropim.errors import ConfigError
from ropim.tracking.registry import registry_lines_muted

TIMEOUT_LOGGER = "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"
RAY_TIMEOUT_WARNING = ("Failed to send resource request for train-dd17941a. If this only happens transiently during "
                       "network partition or CPU being overloaded, it's safe to ignore this error. If this error "
                       "persists, file a GitHub issue.")
# as Ray's log monitor hands the driver a line of Train's controller (the pid prefix is added when it is printed)
PREEMPTION_LINE = ("[2026-11-26 01:48:06,616 E 892 931] core_worker.cc:2465: Actor with class name: "
                   "'PreemptionWatcher' and ID: 'f0c15b4dfdff3ce474d0e99201000000' has constructor arguments in the "
                   "object store and max_restarts > 0.")
# as the raylet's warning reaches the driver (Ray's error channel, printed through its log deduplicator)
WORKER_POOL_LINE = ("WARNING: 8 PYTHON worker processes have been started on node: 5e1f0c with address: 10.0.0.5, "
                    "which is 4x the maximum expected startup concurrency (2). This could be a result of using a large "
                    "number of actors, tasks blocked in ray.get() calls, or tasks with fractional CPU requests (e.g., "
                    "num_cpus=0.1) allowing high concurrency. See https://github.com/ray-project/ray/issues/3644 for "
                    "some discussion of workarounds.")
SETTINGS = ("RAY_DISABLE_WORKER_LOG_PREFIX", "RAY_DEDUP_LOGS_SKIP_REGEX", "RAY_RUNTIME_ENV_HOOK",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "MLFLOW_LOGGING_LEVEL")


@pytest.fixture
def quiet(monkeypatch):
    """``quiet_console()`` in this process, undone afterwards (environment, levels, filters, thread hook)."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    names = [*console.QUIET_RECORDS, *console.INPUT_ERROR_RECORDS, *console.ONE_LINE_RECORDS, "ray", "alembic",
             "ropim"]
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters), list(logging.getLogger(n).handlers))
             for n in names}
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    streams = sys.stdout, sys.stderr
    console.quiet_console()
    assert (sys.stdout, sys.stderr) == streams  # nothing swapped
    yield
    for n, (level, filters, handlers) in saved.items():
        logger = logging.getLogger(n)
        logger.setLevel(level)
        logger.filters[:], logger.handlers[:] = filters, handlers


def logged(records: list[tuple[str, str, bool]]) -> str:
    """What a plain handler writes for (logger, message, with the current exception's traceback) records."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(message)s"))
    loggers = {logging.getLogger(name) for name, _, _ in records}
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        for name, message, with_traceback in records:
            try:
                raise TimeoutError("Get timed out: some object(s) not ready.")
            except TimeoutError:
                logging.getLogger(name).warning(message, exc_info=with_traceback)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
            logger.propagate = True
    return out.getvalue()


@contextlib.contextmanager
def written(name: str) -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """Logger ``name`` and what a plain handler on it writes meanwhile (its filters apply)."""
    out = io.StringIO()
    logger = logging.getLogger(name)
    logger.addHandler(handler := logging.StreamHandler(out))
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)


def test_internal_lines_dropped_job_lines_kept(quiet, capsys) -> None:
    skip = re.compile(os.environ["RAY_DEDUP_LOGS_SKIP_REGEX"])  # Ray's deduplicator drops the lines it matches
    lines = ["[pretrain] epoch 1/2 loss 1.0", PREEMPTION_LINE, WORKER_POOL_LINE,
             "[pretrain] registered encoder models:/ropim-encoder/3"]
    assert [line for line in lines if not skip.search(line)] == [lines[0], lines[3]]
    with registry_lines_muted():  # how MLflow's registry prints its lines, muted where ropim registers
        eprint("Successfully registered model 'ropim-encoder'.")
        eprint("Created version '3' of model 'ropim-encoder'.")
    eprint("[mlflow] a line outside registration")
    assert capsys.readouterr().err == "[mlflow] a line outside registration\n"


def test_warning_dropped_with_its_traceback_only(quiet) -> None:
    job = "ropim.train.loop"
    shown = logged([(job, "[pretrain] epoch 1/2 loss 1.0", False), (TIMEOUT_LOGGER, RAY_TIMEOUT_WARNING, True),
                    (job, "[pretrain] epoch 2/2 loss 0.9", False), (job, "the job's own error", True)])
    head, error = shown.split("the job's own error\n")
    assert head == "[pretrain] epoch 1/2 loss 1.0\n[pretrain] epoch 2/2 loss 0.9\n"
    assert error.startswith("Traceback (most recent call last):") and error.endswith("TimeoutError: Get timed out: "
                                                                                     "some object(s) not ready.\n")


def test_line_after_warning_without_traceback_is_kept(quiet) -> None:
    shown = logged([(TIMEOUT_LOGGER, RAY_TIMEOUT_WARNING, False), ("ropim.train.loop", "[pretrain] epoch 2/2", False)])
    assert shown == "[pretrain] epoch 2/2\n"


def test_a_workers_traceback_is_dropped_for_bad_input_said_in_one_line_only(quiet) -> None:
    for name, start in console.INPUT_ERROR_RECORDS.items():  # Ray Train's worker, Ray Data's executor and splits
        with written(name) as (logger, out):
            logs_each_error(logger, start)
        shown = out.getvalue()
        assert "BadImageError" not in shown and "RuntimeError: CUDA error" in shown and "ConfigError: \n" in shown
        assert shown.count(start) == 3


def logs_each_error(logger: logging.Logger, start: str) -> None:
    """A bad image, a crash and an empty ConfigError logged as Ray logs them: inside the ``except`` that handles
    each (Ray Train's worker, Ray Data's split), or as the record's own (Ray Data's executor); then a record about
    none."""
    for err in (BadImageError("img7.png: cannot decode image; set data.on_bad_image=skip"),
                RuntimeError("CUDA error: an illegal memory access was encountered"), ConfigError("")):
        try:
            raise err
        except Exception:
            text = f"{start}\nTraceback (most recent call last):\n  …\n{type(err).__name__}: {err}"
            logger.error(text, exc_info=err if "executor" in logger.name else None)
    logger.error(f"{start} logged outside an except")


def test_tunes_record_of_a_failed_trial_shows_bad_input_in_one_line_and_keeps_other_tracebacks(quiet) -> None:
    from ray.exceptions import RayTaskError

    from ropim.train.guard import Diverged

    (name, start), = console.ONE_LINE_RECORDS.items()
    with written(name) as (logger, out):
        for cause in (Diverged("loss is nan at step 12; lower base_lr"), RuntimeError("CUDA error: illegal access")):
            try:
                raise RayTaskError("train", "Traceback (most recent call last): …", cause)
            except RayTaskError as err:  # as Tune logs a trial's failure: the error as the record's exc_info
                logger.error(f"{start} trial_driver_1", exc_info=err)
    one, crash = out.getvalue().split(f"{start} trial_driver_1", 2)[1:]
    assert one == ": loss is nan at step 12; lower base_lr\n"
    assert crash.startswith("\nTraceback (most recent call last):") and "RayTaskError" in crash


def test_cleaner_thread_traceback_dropped(quiet, monkeypatch) -> None:
    seen = []  # the threads whose uncaught exception reaches the hook in place before (Python's prints it)
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.thread.name))
    console.quiet_ray_internals()

    def fail() -> None:
        raise ConnectionError("Found multiple active Ray instances: {'a:1', 'b:2'}. Please specify the one")

    for name in ("PlacementGroupCleanerMonitor", "the-jobs-thread"):
        thread = threading.Thread(target=fail, name=name)
        thread.start()
        thread.join()
    assert seen == ["the-jobs-thread"]


def test_an_exit_raised_inside_a_finalizer_is_dropped_other_unraisable_errors_kept(quiet, monkeypatch) -> None:
    seen = []  # what reaches the hook in place before (Python's prints "Exception ignored in: …" and the traceback)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    console.quiet_ray_internals()

    class Finalized:
        def __init__(self, err: BaseException) -> None:
            self.err = err

        def __del__(self) -> None:  # as Ray's SIGTERM handler raising SystemExit while a WeakSet callback runs
            raise self.err

    for err in (SystemExit(1), RuntimeError("a finalizer's own bug")):
        Finalized(err)  # dropped at once: its __del__ runs, Python cannot raise what it raises
    assert seen == [RuntimeError]


def test_ray_workers_get_the_same_filters_through_the_job_runtime_env(quiet) -> None:
    hook = os.environ["RAY_RUNTIME_ENV_HOOK"]
    module, name = hook.rsplit(".", 1)
    env = getattr(importlib.import_module(module), name)({"env_vars": {"A": "1"}})
    assert env == {"env_vars": {"A": "1"}, "worker_process_setup_hook": "ropim.console.quiet_ray_internals"}
    assert console.job_runtime_env({"worker_process_setup_hook": "mine.setup"})["worker_process_setup_hook"] == (
        "mine.setup")


def test_ray_deprecation_of_its_own_option_is_dropped_others_kept(quiet) -> None:
    from ray.util.annotations import RayDeprecationWarning

    with warnings.catch_warnings(record=True) as seen:
        console.quiet_ray_internals()  # inside catch_warnings: the filters it adds are undone after
        for message in ("`ExecutionOptions.exclude_resources` is deprecated and will be removed after January 2027.",
                        "`some_other_option` is deprecated"):
            warnings.warn(message, RayDeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["`some_other_option` is deprecated"]


def test_the_filtered_records_still_exist_in_the_installed_ray() -> None:
    # a Ray upgrade that moves or rewords one of them fails here instead of letting it through unnoticed
    from ray.data.context import OK_PREFIX

    for name, start in {**console.QUIET_RECORDS, **console.INPUT_ERROR_RECORDS, **console.ONE_LINE_RECORDS}.items():
        source = Path(importlib.util.find_spec(name).origin).read_text().replace("{OK_PREFIX}", OK_PREFIX)
        assert start[:30] in source, name
    for start in console.QUIET_WARNINGS.values():
        options = "ray.data._internal.execution.interfaces.execution_options"
        assert start in Path(importlib.util.find_spec(options).origin).read_text()
    raylet = Path(importlib.util.find_spec("ray").origin).parent / "core" / "src" / "ray" / "raylet" / "raylet"
    worker_pool = b"worker processes have been started on node: %s with address: %s, which is %dx the maximum expected"
    assert worker_pool + b" startup concurrency" in raylet.read_bytes()  # the raylet's format of WORKER_POOL_LINE
    cleaner = "ray.train.v2._internal.execution.controller.placement_group_cleaner"
    assert f'name="{console.QUIET_THREADS[0]}"' in Path(importlib.util.find_spec(cleaner).origin).read_text()


def environ_set_at_import(tree: ast.Module) -> list[int]:
    """Lines of module-level statements (not inside a function or class) that write ``os.environ``."""
    found = []
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for node in ast.walk(stmt):
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else (
                node.targets[0].value if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                else None)
            if isinstance(target, ast.Attribute) and target.attr == "environ" or (
                    isinstance(node, ast.Call) and ast.unparse(node.func) == "os.putenv"):
                found.append(node.lineno)
    return found


def test_nothing_is_set_at_import() -> None:
    assert environ_set_at_import(ast.parse('import os\nos.environ.setdefault("A", "1")\nos.environ["B"] = "2"\n'
                                           'def f():\n    os.environ["C"] = "3"\n')) == [2, 3]
    root = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(root)): lines for top in ("ropim", "tune", "jobs") for p in (root / top).rglob("*.py")
             if (lines := environ_set_at_import(ast.parse(p.read_text())))}
    assert found == {}


@pytest.mark.cluster  # a fresh local Ray of its own (48 s): in make test-cluster
def test_a_two_worker_ray_data_pretraining_prints_one_line_per_epoch(tmp_path, empty_store) -> None:
    # ropim's lines only, on a fresh local Ray: before, Ray Data's progress bars, its execution notices and Ray Train's
    # deprecation warning wrote 239 lines (24.7 KB) around the 2 epoch lines of this run
    import shutil

    shutil.copyfile(empty_store, tmp_path / "mlflow.db")
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    job = subprocess.run([sys.executable, "-m", "ropim.cli", "pretrain", "--preset", "digits_demo", "--ingest",
                          "ray_data", "--num_workers", "2", "--cpus_per_worker", "0.5", "--epochs", "2",
                          "--max_steps_per_epoch", "2", "--model.depth", "1", "--viz_every", "0",
                          "--run_name", "lines"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    lines = [line for line in (job.stdout + job.stderr).splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("[pretrain] ") or line == "models:/ropim-encoder/1"]
    assert [line for line in ours if "] epoch " in line][0].endswith("GiB")  # the first says a worker's peak RSS
    assert len([line for line in ours if "] epoch " in line]) == 2
    assert len(lines) - len(ours) <= 3, lines  # at most a few lines of Ray starting
    assert len(job.stdout + job.stderr) < 3000


def test_the_eta_reads_in_hours_for_a_long_run():
    # a 300-epoch ViT-B run at 20 min an epoch printed "ETA 5980.0 min"
    assert [console.eta_text(s) for s in (0, 90, 7199, 7200, 299 * 1200)] == ["0.0 min", "1.5 min", "120.0 min",
                                                                              "2.0 h", "99.7 h"]


def test_pace_says_long_work_once_a_period_and_short_work_not(monkeypatch):
    clock = iter([0.0, 10.0, 31.0, 40.0, 62.0, 70.0])  # the start, then each piece's end
    monkeypatch.setattr(console.time, "monotonic", lambda: next(clock))
    said = []
    pace = console.Pace("[segment] epoch 3 val, rank 0's share", 250, said.append)
    for _ in range(5):
        pace(50)  # the last piece (250/250) ends the work: nothing more to say
    assert said == ["[segment] epoch 3 val, rank 0's share: 100/250 images 3.2 img/s ETA 0.8 min",
                    "[segment] epoch 3 val, rank 0's share: 200/250 images 3.2 img/s ETA 0.3 min"]
