"""Where the MLflow tracking store is, and whether it answers — without importing MLflow, so that a command
fails fast on an unreachable store.

Local default: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlartifacts``; ``MLFLOW_TRACKING_URI``
overrides (e.g. the cluster's ``mlflow server``).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ropim.errors import ConfigError


@dataclass(frozen=True)
class ModelRef:
    """A model reference as typed, parsed once: ``models:/NAME/VERSION``, ``models:/NAME@ALIAS``,
    ``runs:/RUN_ID/PATH``, or anything else (a local folder, another URI: ``scheme`` is "")."""

    text: str
    scheme: str = ""  # "models" | "runs" | ""
    name: str = ""
    version: str = ""
    alias: str = ""
    run_id: str = ""
    path: str = ""  # inside the run's artifacts

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        if text.startswith("models:/"):
            ref = text.removeprefix("models:/").strip("/")
            if "@" in ref:
                name, alias = ref.split("@", 1)
                return cls(text, "models", name=name, alias=alias)
            name, _, version = ref.partition("/")
            if not name or not version:
                example = name or "ropim-encoder"
                raise ConfigError(f"{text!r}: a registered model is addressed by version or alias, e.g. "
                                  f"models:/{example}/1 or models:/{example}@champion")
            return cls(text, "models", name=name, version=version)
        if text.startswith("runs:/"):
            run_id, _, path = text.removeprefix("runs:/").strip("/").partition("/")
            if not run_id or not path:
                raise ConfigError(f"{text!r}: a run's model is addressed by the run and its artifact folder, e.g. "
                                  f"runs:/{run_id or 'RUN_ID'}/encoder")
            return cls(text, "runs", run_id=run_id, path=path)
        return cls(text)

    @property
    def in_store(self) -> bool:
        """Whether the model lives in MLflow (a registered version or alias, a run's artifact)."""
        return bool(self.scheme)


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the sqlite store in the working directory; a sqlite file given relative
    (``sqlite:///mlflow.db``) made absolute, as Ray workers and Tune trials run in other folders."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path.cwd() / uri.removeprefix('sqlite:///')}"
    return uri


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
    ref = ModelRef.parse(model_uri)
    if not ref.in_store or missing_sqlite_file(uri) is None:
        return
    if ref.run_id:
        what = f"no MLflow run {ref.run_id!r}"
    elif ref.alias:
        what = f"no alias {ref.alias!r} on model {ref.name!r}"
    else:
        what = "no such registered version"
    raise LookupError(f"{kind} {model_uri}: {what}: the tracking store {uri} does not exist yet; set "
                      "MLFLOW_TRACKING_URI to the store that holds it, or run from the folder whose mlflow.db does")

