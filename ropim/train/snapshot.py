"""Ray Train's record of a run's checkpoints, ``<run folder>/checkpoint_manager_snapshot.json`` (Ray 2.60's format),
kept true before a run's trainer starts (``tidy``). No Ray imported here.

Ray Train (V2) uploads a checkpoint to ``<run folder>/checkpoint_<date>_<time>.<µs>``, then its controller registers
it by rewriting the snapshot, the only record a restarted run reads. A folder the snapshot does not name (the
controller died between the upload and the registration, or a worker died while uploading) is never restored and
never deleted by Ray (``remove_uncommitted``). A folder the snapshot names but that is gone (deleted by hand, lost
with a disk) stops Ray Train from starting (``forget_missing``): the run continues from the newest one left, as
``ropim.train.checkpoint.restore`` passes over one that cannot be loaded.
"""

from __future__ import annotations

import json
import re

import pyarrow.fs as pafs

from ropim.errors import ConfigError
from ropim.filesystems import filesystem, write_whole

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the checkpoints it registered
RAY_CHECKPOINT = re.compile(r"checkpoint_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}\.\d{6}")  # Ray's default folder names


def tidy(run_dir: str, ray: bool) -> None:
    """Before a run's trainer starts: remove an earlier job's uploads that Ray never registered (``ray``: the run uses
    Ray Train; in-process runs name their checkpoints otherwise), then drop the checkpoints that are gone."""
    if ray:
        remove_uncommitted(run_dir)
    forget_missing(run_dir)


def registered(snapshot: str) -> set[str]:
    """Every checkpoint folder name a Ray Train snapshot mentions (registered, latest, pending, validated, …)."""
    names: set[str] = set()
    todo = [json.loads(snapshot)]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo += item.values()
        elif isinstance(item, list):
            todo += item
        elif isinstance(item, str) and RAY_CHECKPOINT.fullmatch(item.strip("/")):
            names.add(item.strip("/"))
    return names


def remove_uncommitted(run_dir: str) -> list[str]:
    """Delete the checkpoint folders of ``run_dir`` (a folder or URI) that Ray Train never registered, while no
    controller of the run is alive (before its trainer starts, after it failed); return their names. A folder the
    snapshot names is never touched, and nothing is when the snapshot cannot be read; without a snapshot nothing was
    registered (a restarted run starts over), so every folder of Ray's naming goes."""
    fs, root = filesystem(run_dir)
    folders = {f.base_name for f in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
               if f.type == pafs.FileType.Directory and RAY_CHECKPOINT.fullmatch(f.base_name)}
    if not folders:
        return []
    snapshot = f"{root}/{SNAPSHOT}"
    keep: set[str] = set()
    if fs.get_file_info(snapshot).type != pafs.FileType.NotFound:
        try:
            with fs.open_input_stream(snapshot) as f:
                keep = registered(f.read().decode())
        except (OSError, ValueError):  # unreadable, cut short, not JSON: keep everything
            return []
    stale = sorted(folders - keep)
    for name in stale:
        fs.delete_dir(f"{root}/{name}")
    return stale


def forget_missing(run_dir: str) -> list[str]:
    """Drop from Ray Train's snapshot of the run in ``run_dir`` (a folder or URI) the checkpoints whose folders are
    gone (deleted by hand, lost with a disk), saying so in one line; the run then continues from the newest one left.
    Return their names. ConfigError when every checkpoint it lists is gone. Nothing to do without a snapshot (a new
    run, or one in this process)."""
    fs, root = filesystem(run_dir)
    path = f"{root}/{SNAPSHOT}"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    with fs.open_input_stream(path) as f:
        state = json.loads(f.read().decode())
    results = list(zip(state["checkpoint_results"], state["checkpoint_report_indices"], strict=True))
    missing = [r["checkpoint_dir_name"] for r, _ in results
               if fs.get_file_info(f"{root}/{r['checkpoint_dir_name']}").type == pafs.FileType.NotFound]
    if not missing:
        return []
    kept = [(r, i) for r, i in results if r["checkpoint_dir_name"] not in missing]
    if not kept:
        raise ConfigError(f"no checkpoint of this run is left: {', '.join(missing)} missing from {run_dir}; move the "
                          "run's folder away to start it over, or give a new run_name")
    latest = max(kept, key=lambda k: k[1])[0]
    state["checkpoint_results"], state["checkpoint_report_indices"] = [r for r, _ in kept], [i for _, i in kept]
    if (state.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name") in missing:
        state["latest_checkpoint_result"] = latest
    pending = [(r, v) for r, v in zip(state["pending_training_results"], state["pending_validation_specs"],
                                      strict=True) if r["checkpoint_dir_name"] not in missing]
    state["pending_training_results"] = [r for r, _ in pending]
    state["pending_validation_specs"] = [v for _, v in pending]
    for key in ("validated_checkpoint_dir_names", "timed_out_validation_checkpoint_dir_names",
                "failed_validation_checkpoint_dir_names"):
        state[key] = [name for name in state.get(key, []) if name not in missing]
    write_whole(fs, path, json.dumps(state).encode())  # a kill while it is written leaves Ray's snapshot whole
    print(f"{run_dir}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; the run continues from "
          f"{latest['checkpoint_dir_name']}, the newest checkpoint left", flush=True)
    return missing
