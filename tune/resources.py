"""Give back the CPUs of trials Tune stopped (ASHA, an interrupt) even when Ray Train cannot.

When Tune stops a trial, the trial's actor exits and takes its Ray Train controller with it, but not the Train
worker group's placement group: Ray Train frees it from a detached cleaner that asks the dashboard's state API
whether the controller is alive. Without a dashboard, or with several Ray instances on one machine (the state
client then cannot tell which to ask), the placement group keeps its CPUs and later trials wait forever.

So rank 0 of every trial records its placement group id in the trial's Train folder, and the sweep removes the
recorded groups of trials that ended (a few seconds after they ended, once their controller is gone) and, once
``Tuner.fit`` returned or raised (Tune stopped every trial), of every trial. Groups Ray Train already removed are
skipped. A stop signal leaves them to Ray: a running trial's group removed would restart its Train run, and Ray
frees a job's groups once the job has ended and their creators are gone.
"""

from __future__ import annotations

import time

import pyarrow.fs as pafs
from ray.tune import Callback

from ropim.filesystems import filesystem
from ropim.train.runtime import WorkerFn
from ropim.train.task import Worker

PG_FOLDER = "placement_groups"
GRACE_S = 5.0  # after a trial ends, before its group is removed (its controller must be gone by then)


def record_placement_group(worker_fn: WorkerFn, config: dict, worker: Worker) -> None:
    """Run ``worker_fn`` after recording rank 0's placement group under ``<storage>/<run>/``."""
    from ray.util import get_current_placement_group

    pg = get_current_placement_group()
    if pg is not None and worker.rank == 0:
        cfg = config["cfg"]
        fs, folder = filesystem(f"{cfg['storage_path']}/{cfg['run_name']}/{PG_FOLDER}")
        fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(f"{folder}/{pg.id.hex()}"):
            pass
    worker_fn(config, worker)


def release(run_dir: str) -> int:
    """Remove the live placement groups recorded under ``run_dir``; return how many were removed."""
    import ray
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    fs, folder = filesystem(f"{run_dir}/{PG_FOLDER}")
    if fs.get_file_info(folder).type != pafs.FileType.Directory:
        return 0
    removed = 0
    for info in fs.get_file_info(pafs.FileSelector(folder)):
        pg = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(info.base_name)))
        if placement_group_table(pg).get("state") in (None, "REMOVED"):
            continue
        try:
            remove_placement_group(pg)
            removed += 1
        except Exception:  # noqa: BLE001 — removed meanwhile
            pass
    return removed


def release_all(train_storage: str) -> int:
    """``release`` every trial folder under the sweep's Train storage (call when no trial of it runs)."""
    fs, root = filesystem(train_storage)
    if fs.get_file_info(root).type != pafs.FileType.Directory:
        return 0
    return sum(release(f"{train_storage}/{info.base_name}") for info in fs.get_file_info(pafs.FileSelector(root))
               if info.type == pafs.FileType.Directory)


class ReleaseEndedTrials(Callback):
    """Tune callback: removes the recorded placement groups of trials that completed, stopped or failed."""

    def __init__(self, train_storage: str):
        self.train_storage = train_storage
        self._ended: dict[str, float] = {}

    def _end(self, trial) -> None:
        self._ended.setdefault(trial.trial_id, time.monotonic())

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial)

    def on_step_end(self, iteration, trials, **info):
        now = time.monotonic()
        for trial_id, ended in list(self._ended.items()):
            if now - ended >= GRACE_S:
                del self._ended[trial_id]
                n = release(f"{self.train_storage}/trial_{trial_id}")
                if n:
                    print(f"[sweep] freed {n} placement group(s) left by stopped trial {trial_id}", flush=True)
