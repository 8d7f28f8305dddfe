"""Where the MLflow tracking store is, and whether it answers — without importing MLflow, so that a command
fails fast on an unreachable store.

Local default: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlartifacts``; ``MLFLOW_TRACKING_URI``
overrides (e.g. the cluster's ``mlflow server``).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the sqlite store in the working directory (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_tracking(uri: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the URI and the fix, when the tracking store cannot be reached."""
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).read()
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(
                f"MLFLOW_TRACKING_URI={uri}: MLflow server unreachable ({err}). Start it (`make cluster-up`) "
                "or unset MLFLOW_TRACKING_URI to use the local sqlite store."
            ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise ConnectionError(f"MLFLOW_TRACKING_URI={uri}: folder {folder} is missing or not writable.")


def missing_sqlite_file(uri: str) -> str | None:
    """The file of a local sqlite store that does not exist yet (nothing is tracked or registered there), else None."""
    db = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else None
    return db if db and db != ":memory:" and not os.path.exists(db) else None


def check_model_in_store(model_uri: str, kind: str, uri: str) -> None:
    """One clear error, before MLflow is imported, when ``model_uri`` (``models:/…``, ``runs:/…``) names a model in
    a local sqlite store whose file does not exist yet: nothing can be registered there, and looking would create
    the store."""
    if not model_uri.startswith(("models:/", "runs:/")) or missing_sqlite_file(uri) is None:
        return
    ref = model_uri.split(":/", 1)[1].strip("/")
    if model_uri.startswith("runs:/"):
        what = f"no MLflow run {ref.split('/')[0]!r}"
    elif "@" in ref:
        what = "no alias {1!r} on model {0!r}".format(*ref.split("@", 1))
    else:
        what = "no such registered version"
    raise LookupError(f"{kind} {model_uri}: {what}: the tracking store {uri} does not exist yet; set "
                      "MLFLOW_TRACKING_URI to the store that holds it, or run from the folder whose mlflow.db does")

