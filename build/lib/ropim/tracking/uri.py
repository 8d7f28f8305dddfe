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
