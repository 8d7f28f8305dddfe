"""Where runs keep their files: a local folder or any URI pyarrow's filesystems understand (``s3://``, ``gs://``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs


def storage_fs(location: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local folder (made absolute) or a URI."""
    if "://" in location:
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), str(Path(location).absolute())


def exists(location: str) -> bool:
    """Whether a file or folder is there."""
    fs, path = storage_fs(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound
