"""Where runs keep their files: a local folder or any URI pyarrow's filesystems understand (``s3://``, ``gs://``)."""

from __future__ import annotations

import pyarrow.fs as pafs

from ropim.filesystems import filesystem


def exists(location: str) -> bool:
    """Whether a file or folder is there."""
    fs, path = filesystem(location)
    return fs.get_file_info(path).type != pafs.FileType.NotFound
