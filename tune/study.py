"""Where a TPE sweep's Optuna study lives: Optuna's own RDB storage (sqlite) beside the Tune experiment, so the
study's history survives an interrupted sweep and the report reads it back without unpickling the searcher."""

from __future__ import annotations

from pathlib import Path

import optuna

from ropim.paths import is_uri
from tune.config import SweepConfig


def study_storage(cfg: SweepConfig) -> optuna.storages.RDBStorage | None:
    """The sqlite storage ``<storage_path>/<name>/optuna.db`` of a sweep on local storage (None on remote storage:
    the study then lives with the searcher in Tune's own experiment state)."""
    if is_uri(cfg.storage_path):
        return None
    folder = Path(cfg.storage_path) / cfg.name
    folder.mkdir(parents=True, exist_ok=True)
    return optuna.storages.RDBStorage(f"sqlite:///{(folder / 'optuna.db').absolute()}")


def load_study(cfg: SweepConfig) -> optuna.Study | None:
    """The sweep's Optuna study from its storage, or None when it has none."""
    storage = study_storage(cfg)
    if storage is None or cfg.name not in {s.study_name for s in optuna.get_all_study_summaries(storage)}:
        return None
    return optuna.load_study(study_name=cfg.name, storage=storage)
