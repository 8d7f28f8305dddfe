"""The MLflow tracking store: a client on it, experiments, and the few run operations the jobs use.

Any number of jobs may share one store. A local sqlite store is created and migrated once, by whichever job comes
first, under an exclusive lock on ``<store>.lock`` (``fcntl``; the others wait, then find it ready); every call a
client makes is retried with backoff while sqlite answers "database is locked" (another job is writing). For heavy
concurrent use, an MLflow server on PostgreSQL (``make cluster-up``) is the store to use.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import re
import tempfile
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import mlflow
from mlflow.entities import LoggedModelStatus, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.tracking import MlflowClient

from ropim.paths import recorded_location
from ropim.tracking.signals import STOP
from ropim.tracking.uri import check_tracking, tracking_uri

# what a call to the store ends with when the store does not take it (a server down, sqlite locked past the retries,
# a bad request): MLflow's error, for the layers above that do not import MLflow
TrackingError = MlflowException
READY: set[str] = set()  # stores this process found created and migrated
BUSY = ("database is locked", "database table is locked")
RETRIES = 8  # waits of about 0.2, 0.4, … 25.6 s: a minute in all


def retrying(fn: Callable) -> Callable:
    """``fn``, called again with exponential backoff (and jitter) while the store is busy ("database is locked")."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        for attempt in range(RETRIES + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # MlflowException or the SQLAlchemy error it wraps
                if attempt == RETRIES or not any(b in str(err) for b in BUSY):
                    raise
                time.sleep(0.2 * 2**attempt * random.uniform(0.5, 1.5))

    return call


class RetryingClient:
    """An ``MlflowClient`` whose every method is ``retrying``, and runs whole when a stop signal arrives (a Ctrl+C
    or SIGTERM in the middle of a sqlite commit would leave the store locked for the rest of the job)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client = client

    def __getattr__(self, name: str):
        attr = getattr(self.client, name)
        return retrying(STOP.deferred()(attr)) if callable(attr) else attr  # each attempt whole


def prepare_store(uri: str) -> None:
    """Create and migrate a local sqlite store once, under an exclusive lock beside it (``<store>.lock``), so that
    jobs starting at the same moment do not migrate it twice (alembic fails then); other stores are left to their
    server. A job creates the lock file before the store, so a store found without one was made whole by something
    else (``mlflow server``, a copy): it is used as it is and nothing is written beside it."""
    if uri in READY or not uri.startswith("sqlite:///"):
        return
    db = Path(uri.removeprefix("sqlite:///"))
    lock_file = db.with_name(db.name + ".lock")
    if db.exists() and not lock_file.exists():
        READY.add(uri)
        return
    with open(lock_file, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        c = RetryingClient(MlflowClient(tracking_uri=uri, registry_uri=uri))
        c.search_experiments(max_results=1)  # the tracking store's tables, created or migrated
        c.search_registered_models(max_results=1)  # the registry's
    READY.add(uri)


def client(uri: str | None = None) -> RetryingClient:
    """A client on ``uri`` (default: ``tracking_uri()``), its calls ``retrying``, the store prepared
    (``prepare_store``); also makes ``uri`` the process-wide URI, and MLflow's artifact uploads bar-free."""
    uri = uri or tracking_uri()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bars in the jobs' logs
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    prepare_store(uri)
    return RetryingClient(MlflowClient(tracking_uri=uri, registry_uri=uri))


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """The id of experiment ``name``, created (artifacts beside a local sqlite store) when missing; a job that
    creates it at the same moment as another finds the other's."""
    uri = uri or tracking_uri()
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    try:
        return c.create_experiment(name, artifact_location=location)
    except MlflowException as err:
        if err.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
        return c.get_experiment_by_name(name).experiment_id


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    """{'model': {'rho': 0.14}} -> {'model.rho': 0.14}."""
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def create_run(experiment: str, run_name: str | None, params: dict, tags: dict | None = None,
               uri: str | None = None) -> str:
    """Start a run (left RUNNING), log ``params`` flattened and ``tags``; return its id. A data set's ``source`` is
    logged as ``ropim.paths.recorded_location`` records it (inside a Ray job's copy of the working folder:
    ``working_dir:<relative path>``)."""
    uri = uri or tracking_uri()
    c = client(uri)
    run = c.create_run(ensure_experiment(experiment, uri), run_name=run_name, tags=tags or {})
    flat = {k: recorded_location(v) if k.rsplit(".", 1)[-1] == "source" else v for k, v in flatten(params).items()}
    c.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in flat.items()])
    return run.info.run_id


def answers(uri: str | None = None, timeout: float = 5.0) -> bool:
    """Whether the tracking store answers now: an MLflow server's ``/health`` within ``timeout`` seconds (a local
    store: its folder writable). One short request, where a call to a server that is down waits out MLflow's own
    retries (about 4 minutes with its defaults)."""
    try:
        check_tracking(uri or tracking_uri(), timeout)
    except ConnectionError:
        return False
    return True


def log_metrics(run_id: str, metrics: dict[str, float], step: int, uri: str | None = None) -> None:
    """Log a dict of metrics at ``step``."""
    now = int(time.time() * 1000)
    client(uri).log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def log_epochs(run_id: str, epochs: list[dict[str, float]], uri: str | None = None) -> None:
    """Log each epoch's metrics at its ``epoch`` (1-based) as the MLflow step, in one call; a metric the run already
    has at that epoch is left as it is (a run restarted from an earlier checkpoint trains those epochs again)."""
    c, now = client(uri), int(time.time() * 1000)
    keys = {k for m in epochs for k in m if k != "epoch"}
    have = {k: metric_steps(run_id, k, uri) for k in keys}
    metrics = [Metric(k, float(v), now, int(m["epoch"])) for m in epochs for k, v in m.items()
               if k != "epoch" and int(m["epoch"]) not in have[k]]
    if metrics:
        c.log_batch(run_id, metrics=metrics)


def metric_steps(run_id: str, key: str, uri: str | None = None) -> set[int]:
    """The steps (epochs, for a job's metrics) at which the run holds metric ``key``."""
    return {m.step for m in client(uri).get_metric_history(run_id, key)}


def set_tags(run_id: str, tags: dict[str, object], uri: str | None = None) -> None:
    """Set run tags."""
    client(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_text(run_id: str, text: str, artifact_file: str, uri: str | None = None) -> None:
    """Store ``text`` as a run artifact."""
    client(uri).log_text(run_id, text, artifact_file)


def log_artifact(run_id: str, local_path: str | Path, artifact_path: str | None = None,
                 uri: str | None = None) -> None:
    """Upload a local file as a run artifact (under ``artifact_path``)."""
    client(uri).log_artifact(run_id, str(local_path), artifact_path)


def requirements(*names: str) -> list[str]:
    """pip requirements of a logged model: each package as installed now, ``==`` a release (a +local build tag
    dropped) or ``>=`` the release a pre-release or dev build leads to: a model loaded without ropim months later gets
    the timm its weights' keys and arguments were written for, and an environment pip can build."""
    out = []
    for name in names:
        installed = metadata.version(name).split("+")[0]
        release = re.match(r"\d+(\.\d+)*", installed)[0]
        out.append(f"{name}=={installed}" if release == installed else f"{name}>={release}")
    return out


def log_pyfunc(run_id: str, **kwargs):
    """``mlflow.pyfunc.log_model(**kwargs)`` on run ``run_id``, without MLflow's warning that no input example was
    given (``ropim.tracking.registry.register_model`` says why). The run keeps its status (a job's open run RUNNING,
    a sweep's finished trial FINISHED): MLflow's run context would end a job's run FINISHED before its model is
    registered, and a stop in between left a finished run that registered nothing, reported as finished by the job
    that continued it."""
    status = mlflow.get_run(run_id).info.status
    mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
            return mlflow.pyfunc.log_model(**kwargs)
    finally:
        mlflow.end_run(status=status)  # off MLflow's active-run stack, as it was


def logged_models(run: mlflow.entities.Run, uri: str | None = None) -> list:
    """The models ``run`` logged (MLflow 3 keeps each apart from the run's artifacts, under its name)."""
    return client(uri).search_logged_models([run.info.experiment_id],
                                            filter_string=f"source_run_id = '{run.info.run_id}'")


def logged_model(run_id: str, name: str, uri: str | None = None) -> str | None:
    """The URI of the model ``name`` that run ``run_id`` logged whole (READY), or None: a job stopped after logging it
    but before registering it logs it once, not again when continued."""
    found = [m for m in logged_models(client(uri).get_run(run_id), uri)
             if m.name == name and m.status == LoggedModelStatus.READY]
    return found[0].model_uri if found else None


def end_run(run_id: str, status: str = "FINISHED", uri: str | None = None) -> None:
    """Mark the run FINISHED / FAILED / KILLED."""
    client(uri).set_terminated(run_id, status)



def artifact_files(run_id: str, folder: str, uri: str | None = None) -> list[tuple[str, str | None]]:
    """(artifact path, local file path or None when the artifact store is remote) of the files in ``folder``."""
    c = client(uri)
    root = c.get_run(run_id).info.artifact_uri
    parsed = urllib.parse.urlparse(root)
    local = urllib.parse.unquote(parsed.path) if parsed.scheme in ("", "file") else None
    return [(f.path, str(Path(local) / f.path) if local else None)
            for f in c.list_artifacts(run_id, folder) if not f.is_dir]


def run_paths(run: mlflow.entities.Run, uri: str | None = None) -> list[str]:
    """What ``runs:/<run id>/…`` can name: the run's models (``logged_models``) and its top-level artifacts, sorted."""
    artifacts = client(uri).list_artifacts(run.info.run_id)
    return sorted({m.name for m in logged_models(run, uri)} | {f.path for f in artifacts})


@contextlib.contextmanager
def run_artifact(run_id: str, artifact_path: str, uri: str | None = None) -> Iterator[Path | None]:
    """A run's artifact downloaded to a temporary local path while the block runs, or None when the run has nothing
    at ``artifact_path``."""
    client(uri)
    with tempfile.TemporaryDirectory(prefix="ropim-artifact-") as tmp:
        try:
            local = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=artifact_path,
                                                            dst_path=tmp))
        except (mlflow.exceptions.MlflowException, OSError):
            local = None
        yield local
