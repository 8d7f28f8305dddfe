"""Local files written whole: readers (another process, a job started meanwhile) see the old file or the new one,
never part of it, and two writers of one file at once each write a temporary file of their own, the last rename
winning. Standard library only."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path``, of this writer's own, to write; renamed onto ``path`` when the block ends,
    removed when it raises."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
