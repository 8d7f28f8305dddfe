"""What a Ray Train run that failed outside the job's code leaves behind: why, in one line (``failure_reason``), and
checkpoint uploads Ray Train never registered (``remove_uncommitted``).

Ray Train (V2) uploads a checkpoint to ``<run folder>/checkpoint_<date>_<time>.<µs>``, then its controller registers
it: it rewrites ``checkpoint_manager_snapshot.json`` in the run folder, the only record a restarted run reads. A folder
the snapshot does not name (the controller died between the upload and the registration, or a worker died while
uploading) is never restored and never deleted by Ray. No Ray imported here.
"""

from __future__ import annotations

import json
import re

import pyarrow.fs as pafs

from ropim.tracking.storage import storage_fs

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the checkpoints it registered
RAY_CHECKPOINT = re.compile(r"checkpoint_\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}\.\d{6}")  # Ray's default folder names
OUT_OF_MEMORY = ("OUT_OF_MEMORY", "running low on memory")  # how Ray words its memory monitor's kills
# Ray 2.60's raylet: "Memory on the node (IP: …, ID: …) was 7.61GB used / 8.00GB limit (0.951)"
NODE_MEMORY = re.compile(r"was (\d[\d.]*\s*[KMGT]?i?B)(?: used)? / (\d[\d.]*\s*[KMGT]?i?B)")


def failure_reason(err: BaseException) -> str:
    """Why a Ray Train run failed, in one line: what failed (Ray Train's controller, a Ray actor of the run) and Ray's
    reason (its memory monitor's kill, with the node's memory then; a process exit; else the error's first line)."""
    inner = getattr(err, "controller_failure", None)
    text = str(inner if inner is not None else err)
    actor = re.search(r"class_name: (\w+)", text)
    what = ("Ray Train's controller failed" if inner is not None else
            f"Ray actor {actor.group(1)} died" if actor else type(err).__name__)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    if type(inner or err).__name__ == "OutOfMemoryError" or any(marker in text for marker in OUT_OF_MEMORY):
        used = NODE_MEMORY.search(text)
        why = "killed by Ray's memory monitor, the node ran low on memory" + (
            f" ({used.group(1)} of {used.group(2)} in use)" if used else "")
    elif exit_type:
        why = f"its process exited ({exit_type.group(1)})"
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().endswith(":")]
        why = (lines or [type(inner or err).__name__])[0][:300]
    return f"{what}: {why}"


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
    fs, root = storage_fs(run_dir)
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
