"""The one place that opens a storage location (data, checkpoints, run folders) as a pyarrow filesystem: a local path
(made absolute, ``~`` expanded) or a URI (``s3://``, ``gs://``, …; ``ropim.paths.is_uri`` tells them apart); and
small files written whole there (``write_whole``)."""

from __future__ import annotations

import os
import posixpath
import uuid

import pyarrow.fs as pafs

from ropim.paths import is_uri


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) of ``location``."""
    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(location))


def write_whole(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a small file under a temporary name of this writer's own, then rename it into place: a reader (a job
    started after a kill) sees the old file or the new one, never part of it."""
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
    with fs.open_output_stream(tmp) as f:
        f.write(data)
    fs.move(tmp, path)
