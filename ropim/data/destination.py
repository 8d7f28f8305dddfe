"""The folder ``ropim data convert`` writes into: where it may be, claiming it with the plan, which shards in it are
whole, and what convert may remove there. No torch, no Ray, no MLflow.

Convert deletes only what it wrote and what holds no image: its own temporary files, a destination it created whose
shards hold no row, and an earlier conversion none of whose shards holds a row (all its images failed to decode) —
only where every file there is convert's own (its plan, ``classes.json``, shards carrying its metadata). Anything
else in the folder, a shard that cannot be read, or a shard with a row keeps the folder as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import posixpath
import socket
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ropim.data.formats.parquet import PLAN, filesystem, read_plan
from ropim.errors import ConfigError
from ropim.filesystems import write_whole
from ropim.paths import is_uri

log = logging.getLogger("ropim.data")
META_KEY = b"ropim.shard"  # each shard's own plan, in its schema metadata (written last, on close)
STAGING = ".ropim_staging"
GUARD = ".ropim_convert.lock"  # held by the conversion writing a local destination (``guarded``)
OWN_FILES = (PLAN, "classes.json", STAGING, GUARD)  # STAGING: a folder (a shuffled Parquet source's: staging)


@contextlib.contextmanager
def guarded(fs: pafs.FileSystem, root: str, dst: str) -> Iterator[None]:
    """This conversion alone writes the local destination ``root`` meanwhile (``flock`` on its ``GUARD``, which the
    system releases when the process ends, however; the file is removed as the conversion ends, and one a killed run
    left is taken over): ConfigError naming the other one writing it now. Remote destinations have no such lock."""
    if not isinstance(fs, pafs.LocalFileSystem):
        yield
        return
    path = posixpath.join(root, GUARD)
    with open(path, "a+") as guard:
        try:
            fcntl.flock(guard, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            guard.seek(0)
            raise ConfigError(f"convert destination {dst!r} is being written by another `ropim data convert` "
                              f"({guard.read().strip() or 'a process'}) right now: wait for it to end; the same "
                              "command then reports or finishes it") from None
        guard.truncate(0)
        guard.write(f"pid {os.getpid()} on {socket.gethostname()}")
        guard.flush()
        try:
            yield
        finally:
            with contextlib.suppress(FileNotFoundError):  # gone with a destination removed as empty
                os.unlink(path)


def check_destination(source: str, dst: str) -> None:
    """The destination may not be the source, lie inside it, or hold it: one error before anything is written."""
    def norm(location: str) -> str:
        return location.rstrip("/") if is_uri(location) else filesystem(location)[1].rstrip("/")

    src, out = norm(source), norm(dst)
    if src == out:
        raise ConfigError(f"convert destination {dst!r} is the source itself; write the shards to a new folder")
    if out.startswith(src + "/"):
        raise ConfigError(f"convert destination {dst!r} is inside the source {source!r}; a re-run would read the "
                          "shards back as source images: give a folder outside it")
    if src.startswith(out + "/"):
        raise ConfigError(f"convert destination {dst!r} holds the source {source!r}; give a folder outside it")


def claim_destination(fs, root: str, dst: str, plan: dict) -> None:
    """Write the plan before any shard, or check that the destination holds this very plan; refuse files convert
    did not write. Only our own leftover temporary files, and an earlier conversion that holds no row
    (``clear_empty``), are removed."""
    stored = read_plan(fs, root)
    if clear_empty(fs, root, dst, stored not in (None, plan)):
        stored = None
    if stored is not None and stored != plan:
        changed = sorted(k for k in set(stored) | set(plan) if stored.get(k) != plan.get(k))
        why = {"shards": "its shards (the source's images changed since, or --shard-size / --shuffle / --seed "
                         "differ)", "classes": "its classes (the source's changed since)"}
        fix = "add --shuffle false to finish it" if in_source_order(stored, plan) else "re-run the command that " \
            "wrote it"
        raise ConfigError(f"convert destination {dst!r} holds a conversion with other settings: "
                          f"{', '.join(why.get(k, f'its {k}') for k in changed)}; {fix}, or give an empty folder")
    for info in fs.get_file_info(pafs.FileSelector(root)):
        name = info.base_name
        if temporary(info):
            fs.delete_file(info.path)  # our own temporary file, left by a killed run
        elif name not in plan["shards"] and name not in OWN_FILES:
            raise ConfigError(f"convert destination {dst!r} holds {name}, which convert did not write; "
                              "give an empty folder or one written by this same convert command")
        elif name in plan["shards"] and stored is None and not complete_shard(fs, info.path, plan["shards"][name]):
            raise ConfigError(f"convert destination {dst!r} holds {name} from another conversion; give an empty "
                              "folder")
    if stored is None:
        write_whole(fs, posixpath.join(root, PLAN), json.dumps(plan, indent=2).encode())


def in_source_order(stored: dict, plan: dict) -> bool:
    """Whether ``stored`` is ``plan`` written in the source's order: what convert wrote of a Parquet source,
    whatever ``--shuffle`` said, before it shuffled one."""
    unshuffled = {name: {**meta, "shuffle": False} for name, meta in plan["shards"].items()}
    return stored == {**plan, "shards": unshuffled}


def temporary(info: pafs.FileInfo) -> bool:
    """Whether a file is one of convert's temporary files (``.NAME.tmp``)."""
    return info.type == pafs.FileType.File and info.base_name.startswith(".") and info.base_name.endswith(".tmp")


def clear_empty(fs, root: str, dst: str, other_plan: bool) -> bool:
    """Remove an earlier conversion that holds no image (its shards all without rows: none of its images decoded,
    e.g. a run of an older version that ended with an empty data set), when every file in ``root`` is convert's own,
    and there are empty shards or ``other_plan`` (its plan is not this run's). One log line; whether it removed it."""
    shards, own = [], []
    for info in fs.get_file_info(pafs.FileSelector(root)):
        if info.type != pafs.FileType.File:
            return False  # a folder inside: not convert's
        if info.base_name in OWN_FILES or temporary(info):
            own.append(info.path)
        else:
            found = shard_info(fs, info.path) if info.base_name.endswith(".parquet") else None
            if found is None or found[1]:
                return False  # a row, a foreign file or one that cannot be read: nothing is removed
            shards.append(info.path)
    if not shards and not other_plan:
        return False
    for path in shards + own:
        if posixpath.basename(path) != GUARD:  # held by this run
            fs.delete_file(path)
    log.info(f"convert destination {dst}: removed an earlier conversion there that holds no image ({len(shards)} "
             f"shard{'s' * (len(shards) != 1)} without rows, its plan and classes.json); converting afresh")
    return True


def shard_info(fs, path: str) -> tuple[dict, int] | None:
    """(the plan stored in a shard convert wrote, its rows); None for a file that is not one (or cannot be read)."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    try:
        meta = pq.read_metadata(path, filesystem=fs)
        stored = meta.schema.to_arrow_schema().metadata or {}
        return (json.loads(stored[META_KEY]), meta.num_rows) if META_KEY in stored else None
    except (OSError, pa.ArrowException, ValueError):
        return None


def complete_shard(fs, path: str, meta: dict) -> bool:
    """Whether ``path`` is a complete shard of this plan (its metadata was written last, on close)."""
    info = shard_info(fs, path)
    return info is not None and info[0] == meta


def kept_shard(fs, path: str, meta: dict) -> bool:
    """Whether a re-run keeps ``path``: a complete shard of this plan that holds a row (one without rows is written
    again: its images may decode now, and trying them again costs little)."""
    info = shard_info(fs, path)
    return info is not None and info[0] == meta and info[1] > 0


def holds_rows(fs, root: str) -> bool:
    """Whether a shard in ``root`` holds a row (True when one cannot be read: then nothing is removed)."""
    try:
        return any(pq.read_metadata(i.path, filesystem=fs).num_rows for i in fs.get_file_info(pafs.FileSelector(root))
                   if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                   and not i.base_name.startswith("."))
    except (OSError, pa.ArrowException):
        return True


def remove_if_empty(fs, root: str, created: bool) -> bool:
    """Remove the destination when this run created it (only it wrote there), no shard in it holds a row and
    nothing is staged (``ropim.data.staging``: a re-run goes on from it): nothing usable was written, so no trace is
    left. Whether it was removed."""
    staged = fs.get_file_info(pafs.FileSelector(posixpath.join(root, STAGING), allow_not_found=True))
    if not created or holds_rows(fs, root) or any(not temporary(i) for i in staged):
        return False
    fs.delete_dir(root)
    return True
