"""Training checkpoints: one folder per checkpoint, written whole. No Ray: the runtime hands folders to Ray Train.

A checkpoint folder holds ``model.safetensors`` (all weights), ``train_state.pt`` (optimizer, grad scaler,
epoch, step; tensors and plain values only, loaded with ``weights_only=True``), ``config.json`` (the job's
config), ``metrics.json`` (the epoch's metrics) and, while the tracking store has not taken some epochs' records,
``unrecorded.json`` (those records). Random state needs no saving: sketches, shuffling, augmentation and drop path
are seeded from (seed, epoch or step, rank), so (epoch, step) determine the rest of the run exactly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file, save_file

from ropim.errors import ConfigError, DataError, first_line
from ropim.paths import is_uri

UNRECORDED = "unrecorded.json"  # epoch records the tracking store had not taken when the checkpoint was written
SCRATCH = "ropim-checkpoint-"  # + host-pid-: a checkpoint being written or uploaded from the temporary folder
Candidates = Iterable[tuple[str, contextlib.AbstractContextManager[str | Path]]]  # (name, a local folder), newest first


class NoRoom(DataError):
    """A checkpoint that did not fit where it is written (no space left on the device): the message says where, and
    what frees room (``ROOM``)."""


ROOM = "lower --keep_checkpoints or give another --storage_path"  # what frees room besides freeing space there


def full(err: BaseException) -> bool:
    """Whether ``err`` is a write that found its device full (Python's or pyarrow's "No space left on device")."""
    return enospc(err) or "No space left on device" in str(err)


def enospc(err: BaseException) -> bool:
    """Whether ``err`` is the write that found its device full itself (its ``errno``), not an error wrapping it."""
    return getattr(err, "errno", None) == errno.ENOSPC


def size_text(n: float) -> str:
    """Bytes as people read them: ``3.4 GB``, ``31 MB``, ``420 kB``."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def folder_bytes(folder: Path) -> int:
    """The bytes of the files below ``folder`` (0 when it is not there)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def room_note(size: int, run_dir: str, keep: int) -> str | None:
    """A line when the local disk of ``run_dir`` has less free space than the run's checkpoints of ``size`` bytes
    need: ``keep`` of them, and the next written before the oldest is dropped, less what the run holds already;
    None when it has room, or is remote storage."""
    if is_uri(run_dir):
        return None
    folder = Path(run_dir)
    disk = next(p for p in (folder, *folder.parents) if p.exists())
    free, held, need = shutil.disk_usage(disk).free, folder_bytes(folder), (keep + 1) * size
    if free >= need - held:
        return None
    return (f"{disk} has {size_text(free)} free: this run keeps {keep} checkpoint(s) of {size_text(size)} and writes "
            f"the next before dropping the oldest ({size_text(need)}, {size_text(held)} of it held already), so it "
            f"will stop when the disk fills; free space there, {ROOM}")


def scratch_folder() -> Path:
    """A new folder in the temporary folder for one checkpoint before Ray uploads it (and deletes it), named after
    this host and process. The ones a process of this host left when it was killed (a worker lost to SIGKILL or the
    kernel's OOM killer mid-upload: a GiB at ViT-B) are removed first."""
    host = socket.gethostname()
    ours = re.compile(re.escape(f"{SCRATCH}{host}-") + r"(\d+)-[^-]+")  # not host "worker-17"'s, on a shared TMPDIR
    for old in Path(tempfile.gettempdir()).glob(f"{SCRATCH}{host}-*-*"):
        if (m := ours.fullmatch(old.name)) and not psutil.pid_exists(int(m[1])):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH}{host}-{os.getpid()}-"))


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer, scaler, epoch: int, step: int,
                    config: dict) -> None:
    """Write a complete checkpoint into ``folder`` (a fresh temporary folder that the runtime then persists)."""
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    state = {"optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
             "scaler": scaler.state_dict() if scaler is not None else {}}
    torch.save(state, folder / "train_state.pt")
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def write_checkpoint(model: torch.nn.Module, optimizer, scaler, epoch: int, step: int, config: dict, metrics: dict,
                     unsent: list) -> Path:
    """Epoch ``epoch``'s checkpoint written whole in a new ``scratch_folder``: ``save_checkpoint``'s files, its
    ``metrics`` and the ``unsent`` records; nothing left of it on an error, NoRoom when the temporary folder is full."""
    folder = None
    try:
        folder = scratch_folder()
        save_checkpoint(folder, model, optimizer, scaler, epoch, step, config)
        (folder / "metrics.json").write_text(json.dumps(metrics))
        if unsent:
            (folder / UNRECORDED).write_text(json.dumps(unsent))
    except BaseException as err:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if full(err):
            raise NoRoom(f"no space left in {tempfile.gettempdir()} (the temporary folder) for epoch {epoch + 1}'s "
                         "checkpoint: free space there, or set TMPDIR to a larger disk") from None
        raise
    return folder


def load_checkpoint(folder: str | Path, model: torch.nn.Module, optimizer=None, scaler=None) -> dict:
    """Load weights (and optimizer / scaler state when given) from ``folder``; return the train state, with the
    epoch records the tracking store had not taken when it was written (``unrecorded``, from ``UNRECORDED``) and
    its epoch's metrics (``metrics``: the numbers of ``metrics.json``, not its extras)."""
    folder = Path(folder)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    state = torch.load(folder / "train_state.pt", map_location="cpu", weights_only=True)  # the optimizer moves it
    unrecorded, metrics = folder / UNRECORDED, folder / "metrics.json"
    state["unrecorded"] = json.loads(unrecorded.read_text()) if unrecorded.exists() else []
    numbers = json.loads(metrics.read_text()).items() if metrics.exists() else ()
    state["metrics"] = {k: v for k, v in numbers if isinstance(v, (int, float))}
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    return state


def restore(candidates: Candidates, model: torch.nn.Module, optimizer=None,
            scaler=None) -> tuple[dict | None, list[str]]:
    """Load the newest of ``candidates`` that loads (a later one fully overwrites what an unreadable one half-loaded);
    return (its train state, or None on a fresh run; the checkpoints that could not be loaded, as "name (why)").
    ConfigError when there were checkpoints and none loads."""
    unreadable = []
    for name, folder in candidates:
        with folder as local:
            try:
                return load_checkpoint(local, model, optimizer, scaler), unreadable
            except Exception as err:  # noqa: BLE001 — cut short, not safetensors, not a checkpoint: try the previous
                unreadable.append(f"{name} ({first_line(err, 200)})")
    if unreadable:
        raise ConfigError(f"no checkpoint of this run can be loaded: {'; '.join(unreadable)}; move them away to "
                          "start the run over, or give a new run_name")
    return None, unreadable
