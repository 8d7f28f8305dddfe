"""Paths mean what the user typed: every path a command takes is resolved once, on the driver, before anything starts.

``resolve_path`` expands ``~`` and joins a relative path to the caller's working folder; it does not follow symbolic
links (the absolute path still goes through them, so a link keeps pointing where the user pointed it). URIs
(``s3://…``, ``gs://…``, ``file://…``, ``models:/…``, ``runs:/…``) and keywords (``digits``) are left as they are.
Every config that holds paths has a ``resolved()`` built on it, and every command calls it once where it starts, so
Ray Train workers, Tune trials and a resumed job (each possibly in another folder) read the same files.

A local path reaches only the machines that see it: ``cluster_note`` words the one line a job prints when it runs on a
Ray cluster of several nodes with local paths, and ``job_copy_note`` the one a ``ray job submit --working-dir``
driver prints when it keeps checkpoints inside Ray's copy of the working folder. ``recorded_location`` is the form in
which MLflow records a path (a data set's identity): one inside that copy, which Ray names anew for every submission,
as ``working_dir:<path relative to the submitted folder>``. Standard library only: configs call this at parse time.
"""

from __future__ import annotations

import json
import os
import re

SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:/")  # s3://, gs://, file://, models:/, runs:/ (not C:\ or a:b)
STORAGE_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://([^/?#]*)([^?#]*)(.*)", re.DOTALL)  # scheme, host, path, rest
# where Ray unpacks an uploaded working folder: <temp dir>/session_<…>/runtime_resources/working_dir_files/_ray_pkg_<h>
RAY_COPY = re.compile(r"/runtime_resources/working_dir_files/_ray_pkg_[0-9a-fA-F]+(?=/|$)")
WORKING_DIR = "working_dir:"  # what a recorded path inside the submitted working folder starts with


def is_uri(location: str) -> bool:
    """Whether ``location`` is a URI rather than a local path."""
    return bool(SCHEME.match(location))


def resolve_path(path: str | None, keywords: tuple[str, ...] = ()) -> str | None:
    """``path`` as an absolute local path (``~`` expanded, joined to the working folder, links kept), or unchanged
    when it is None, empty or one of ``keywords``; a storage URI without a trailing or doubled ``/`` (names are
    joined onto it: ``s3://b/runs/`` would give ``s3://b/runs//NAME``, which pyarrow refuses), ``file:///PATH`` as
    the local path it names."""
    if not path or path in keywords:
        return path
    if (uri := STORAGE_URI.fullmatch(path)) is not None:
        scheme, host, where, rest = uri.groups()
        if scheme.lower() == "file" and not host:
            return os.path.abspath(where or "/")
        return f"{scheme}://{host}{re.sub('/{2,}', '/', where).rstrip('/')}{rest}"
    if is_uri(path):  # models:/…, runs:/…
        return path
    return os.path.abspath(os.path.expanduser(path))


def local_paths(paths: dict[str, str | None]) -> dict[str, str]:
    """The entries of ``paths`` ({field: resolved path}) that are local paths."""
    return {k: v for k, v in paths.items() if v and os.path.isabs(v)}


def cluster_note(paths: dict[str, str | None], nodes: int) -> str | None:
    """The one line to print when workers may run on ``nodes`` > 1 machines and some of ``paths`` are local."""
    local = local_paths(paths)
    if nodes < 2 or not local:
        return None
    named = ", ".join(f"{k}={v}" for k, v in local.items())
    what = "is a local path" if len(local) == 1 else "are local paths"
    return (f"note: this Ray cluster has {nodes} nodes and {named} {what}: workers on other nodes open the same path "
            "there, so it must be on storage mounted at that path on every node (NFS), or give a URI (s3://…)")


def ray_job_copy() -> str | None:
    """The working folder when this process is the driver of a ``ray job submit --working-dir`` job: Ray's copy of
    the submitted folder (a new one whenever its files change, removed when Ray cleans up), else None."""
    try:
        env = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")).get("runtime_env") or {}
    except ValueError:
        return None
    return os.getcwd() if env.get("working_dir") else None


def job_copy_note(storage_path: str, flag: str = "storage_path") -> str | None:
    """The one line for a Ray job whose checkpoints (``storage_path``, resolved) lie inside Ray's copy of the working
    folder (a relative ``--storage_path``, the default's ``ray_results`` included), else None; with ``flag`` another
    local output folder (``out``: a transfer's tables), which Ray's clean-up removes as well."""
    copy = ray_job_copy()
    if copy is None or is_uri(storage_path) or not os.path.abspath(storage_path).startswith(copy + os.sep):
        return None
    if flag != "storage_path":
        return (f"note: {flag}={storage_path} lies inside Ray's copy of the submitted working folder, which Ray "
                f"removes with old copies: give --{flag} an absolute folder outside it to keep what is written there")
    return (f"note: storage_path={storage_path} lies inside Ray's copy of the submitted working folder: a job "
            "submitted after any file of that folder changes gets a new copy and does not see these checkpoints, "
            "and Ray removes old copies; for a long run give --storage_path an absolute folder outside it or a URI "
            "(s3://…)")


def recorded_location(location: str) -> str:
    """How MLflow records ``location`` (a resolved path or URI, possibly followed by ``?split…``) as a data set: a path
    inside Ray's copy of the submitted working folder (``ray_job_copy``, or a path recorded in such a copy before)
    as ``working_dir:`` + the path relative to that folder (``working_dir:data/digits``), the same for every
    submission of the same folder; anything else as it is."""
    if not isinstance(location, str) or is_uri(location) or not location.startswith("/"):
        return location
    copy = ray_job_copy()
    if copy is not None and (location == copy or location.startswith((copy + os.sep, copy + "?"))):
        rest = location[len(copy):]
    else:
        found = RAY_COPY.search(location)
        if found is None:
            return location
        rest = location[found.end():]
    path, query, tail = rest.partition("?")
    return WORKING_DIR + (path.strip("/") or ".") + query + tail
