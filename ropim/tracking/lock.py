"""An exclusive lock on a named run's folder, so two jobs never train the same run at once.

``<storage_path>/<name>/.lock`` holds the owner (host, pid, process start time). On a local disk a job reads and
takes it holding ``.lock.guard`` (``flock``, which the system releases when the holder dies), and writes it whole (a
file of its own renamed into place): of jobs starting one run at once, one takes it. A lock whose owner is gone —
same host, that process no longer alive — is stale and taken over (a job killed with ``kill -9`` does not block its
own resume). On remote storage (``s3://…``) there is no atomic create: the lock is written, read back and kept only if
it is still ours, which narrows the race to the storage's own write ordering.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

import pyarrow.fs as pafs

from ropim.errors import ConfigError
from ropim.filesystems import filesystem
from ropim.paths import is_uri

LOCK = ".lock"
GUARD = ".lock.guard"  # held while a job reads and takes the lock (``fcntl.flock``, local disks)


class RunInUse(ConfigError):
    """Another live job holds the run."""


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux ``/proc``), or None when there is no such
    process; with the pid it names one process even after pids wrap around."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 of proc(5), counted after the command name


def owner() -> dict:
    """This process, as a lock records it."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": start_time(os.getpid()),
            "time": time.time()}


def alive(holder: dict) -> bool:
    """Whether the lock's owner may still run: true for another host (it cannot be checked from here)."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    return isinstance(pid, int) and start_time(pid) is not None and start_time(pid) == holder.get("started")


def acquire(storage_path: str, name: str) -> str:
    """Take the lock of run ``name`` (RunInUse when a live job holds it); return the lock's path."""
    if is_uri(storage_path):
        return acquire_remote(storage_path, name)
    path = Path(storage_path).absolute() / name / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(GUARD), "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # one job at a time reads and takes it; the system lets go if one dies
        if held := live_holder(pafs.LocalFileSystem(), str(path)):
            raise in_use(name, storage_path, held)
        mine = path.with_name(f"{LOCK}.{os.getpid()}.tmp")
        mine.write_text(json.dumps(owner()))
        os.replace(mine, path)  # whole: a reader without the guard (the pre-flight's check) never sees it half-written
    return str(path)


def in_use(name: str, storage_path: str, held: dict) -> RunInUse:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held.get("time", 0)))
    return RunInUse(f"run_name={name!r} is in use by another job (pid {held.get('pid')} on {held.get('host')} since "
                    f"{since}); wait for it to end or pick another run_name (a job that is gone on another host: "
                    f"remove {storage_path}/{name}/{LOCK})")


def check_free(storage_path: str, name: str) -> None:
    """RunInUse when a live job holds run ``name``'s lock; only read (a job takes the lock as it opens the run), so
    that the pre-flight says so before any other trouble with the run."""
    fs, root = filesystem(storage_path)
    if held := live_holder(fs, f"{root}/{name}/{LOCK}"):
        raise in_use(name, storage_path, held)


def live_holder(fs: pafs.FileSystem, path: str) -> dict | None:
    """The owner the lock file ``path`` on ``fs`` records while it may still run (``alive``); None when there is no
    lock, or it vanished, is half-written or its owner is gone (stale)."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    try:
        with fs.open_input_stream(path) as f:
            held = json.loads(f.read().decode())
    except (OSError, ValueError):
        return None
    return held if alive(held) else None


def acquire_remote(storage_path: str, name: str) -> str:
    """The remote-storage lock: unless a live job holds it, write it, read it back, keep it only if still ours (one
    filesystem for the three: opening an S3 one asks the bucket's region)."""
    fs, root = filesystem(storage_path)
    path, me = f"{root}/{name}/{LOCK}", owner()
    if held := live_holder(fs, path):
        raise in_use(name, storage_path, held)
    fs.create_dir(f"{root}/{name}", recursive=True)
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(me).encode())
    if (held := live_holder(fs, path)) != me:  # another job wrote it after us
        raise in_use(name, storage_path, held) if held else RunInUse(
            f"run_name={name!r}: could not take its lock {storage_path}/{name}/{LOCK}; is another job starting it "
            "right now?")
    return f"{storage_path}/{name}/{LOCK}"


def release(lock: str) -> None:
    """Remove a lock this process took."""
    fs, path = filesystem(lock)
    if fs.get_file_info(path).type.name != "NotFound":
        fs.delete_file(path)
