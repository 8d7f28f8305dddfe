"""The one place that opens a storage location (data, checkpoints, run folders) as a pyarrow filesystem: a local path
(made absolute, ``~`` expanded) or a URI (``s3://``, ``gs://``, …; ``ropim.paths.is_uri`` tells them apart)."""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from ropim.paths import is_uri


def filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) of ``location``."""
    if is_uri(location):
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(location))
