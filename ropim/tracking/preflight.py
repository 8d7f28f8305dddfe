"""The models a command names, checked before anything heavy starts: a local folder found whole and its
``config.json`` read (no MLflow, no torch), a registered version or a run's artifact looked up in the store (MLflow
imported only then)."""

from __future__ import annotations

import json
from collections.abc import Callable

from ropim.tracking.model_folder import check_local_model
from ropim.tracking.uri import check_model_in_store, missing_sqlite_file


def check_models(uris: list[str], kind: str, uri: str, check_config: Callable[[str, dict], None] | None = None) -> None:
    """Each of ``uris`` is there: a local folder found whole, its ``config.json`` given to ``check_config`` (without
    MLflow or torch); a registered version or a run's artifact looked up in the store ``uri`` (MLflow imported only
    then)."""
    registered = []
    for model_uri in uris:
        folder = check_local_model(model_uri, kind)
        if folder is None:
            check_model_in_store(model_uri, kind, uri)
            registered.append(model_uri)
        elif folder.is_dir() and check_config is not None:  # its config.json, found whole just above
            check_config(model_uri, json.loads(next(folder.rglob("config.json")).read_text()))
    if registered:
        from ropim.tracking.registry import check_model_uri

        for model_uri in registered:
            check_model_uri(model_uri, kind, uri)


def check_registered_model(name: str, kind: str, uri: str) -> None:
    """The registered model ``name`` ("" = none) a job will register its ``kind`` (encoder, classifier, segmenter)
    into holds no version of another kind (``ropim.tracking.model_folder.MixedKinds``, one line); MLflow imported
    only when the store exists (a local sqlite store not created yet holds nothing)."""
    if not name or missing_sqlite_file(uri) is not None:
        return
    from ropim.tracking.registry import check_registered_kind

    check_registered_kind(name, kind, uri)
