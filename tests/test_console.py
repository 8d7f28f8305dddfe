"""What the terminal shows: Ray's and MLflow's internal lines dropped where they are made (the libraries' own
settings, logging filters), every other line (and the job's errors) kept; no output stream replaced."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import logging
import os
import re
import sys
import threading
from pathlib import Path

import pytest
from mlflow.utils.logging_utils import eprint

from ropim import console
from ropim.tracking.registry import registry_lines_muted

TIMEOUT_LOGGER = "ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client"
RAY_TIMEOUT_WARNING = ("Failed to send resource request for train-dd17941a. If this only happens transiently during "
                       "network partition or CPU being overloaded, it's safe to ignore this error. If this error "
                       "persists, file a GitHub issue.")
# as Ray's log monitor hands the driver a line of Train's controller (the pid prefix is added when it is printed)
PREEMPTION_LINE = ("[2026-11-26 01:48:06,616 E 892 931] core_worker.cc:2465: Actor with class name: "
                   "'PreemptionWatcher' and ID: 'f0c15b4dfdff3ce474d0e99201000000' has constructor arguments in the "
                   "object store and max_restarts > 0.")
SETTINGS = ("RAY_DISABLE_WORKER_LOG_PREFIX", "RAY_DEDUP_LOGS_SKIP_REGEX", "RAY_RUNTIME_ENV_HOOK",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "MLFLOW_LOGGING_LEVEL")


@pytest.fixture
def quiet(monkeypatch):
    """``quiet_console()`` in this process, undone afterwards (environment, levels, filters, thread hook)."""
    for name in SETTINGS:
        monkeypatch.delenv(name, raising=False)
    names = [*console.QUIET_RECORDS, "ray", "alembic", "ropim"]
    saved = {n: (logging.getLogger(n).level, list(logging.getLogger(n).filters), list(logging.getLogger(n).handlers))
             for n in names}
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
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


def test_internal_lines_dropped_job_lines_kept(quiet, capsys) -> None:
    skip = re.compile(os.environ["RAY_DEDUP_LOGS_SKIP_REGEX"])  # Ray's deduplicator drops the lines it matches
    lines = ["[pretrain] epoch 1/2 loss 1.0", PREEMPTION_LINE, "[pretrain] registered encoder models:/ropim-encoder/3"]
    assert [line for line in lines if not skip.search(line)] == [lines[0], lines[2]]
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


def test_ray_workers_get_the_same_filters_through_the_job_runtime_env(quiet) -> None:
    hook = os.environ["RAY_RUNTIME_ENV_HOOK"]
    module, name = hook.rsplit(".", 1)
    env = getattr(importlib.import_module(module), name)({"env_vars": {"A": "1"}})
    assert env == {"env_vars": {"A": "1"}, "worker_process_setup_hook": "ropim.console.quiet_ray_internals"}
    assert console.job_runtime_env({"worker_process_setup_hook": "mine.setup"})["worker_process_setup_hook"] == (
        "mine.setup")


def test_the_filtered_records_still_exist_in_the_installed_ray() -> None:
    # a Ray upgrade that moves or rewords one of them fails here instead of letting it through unnoticed
    for name, start in console.QUIET_RECORDS.items():
        source = Path(importlib.util.find_spec(name).origin).read_text()
        assert start[:30] in source, name
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
