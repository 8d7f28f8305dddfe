"""Parquet shards read through one door: each file's footer (schema, row groups, row count) is read once per process
and kept, keyed by the file's size and modification time (a file written again is read again); column reads reuse
it (``pq.ParquetFile(..., metadata=...)``), so a job reads every footer once, however many times its sources are
opened, checked, listed and evaluated. Inside ``pinned()`` (a job's one listing of its data) a footer read once
stands without asking the storage whether its file changed: on S3 that question is a request per call and shard.
pyarrow only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

FOOTERS: dict[tuple, pq.FileMetaData] = {}  # (filesystem kind, path, size, mtime) -> footer
LATEST: dict[tuple, pq.FileMetaData] = {}  # (filesystem kind, path) -> the footer read last
PINNED = [0]  # ``pinned`` blocks open in this process


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """Within the block, ``footer`` gives a file's footer read in it before without checking the file again (the
    outermost block starts from nothing: what an earlier job of this process read is checked once more)."""
    if not PINNED[0]:
        LATEST.clear()
    PINNED[0] += 1
    try:
        yield
    finally:
        PINNED[0] -= 1


def footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData:
    """The footer of ``path`` on ``fs``, read once while the file stays the same."""
    if PINNED[0] and (known := LATEST.get((fs.type_name, path))) is not None:
        return known
    info = fs.get_file_info(path)
    key = (fs.type_name, path, info.size, info.mtime_ns)
    if key not in FOOTERS:
        FOOTERS[key] = pq.read_metadata(path, filesystem=fs)
    LATEST[key[:2]] = FOOTERS[key]
    return FOOTERS[key]


def schema(fs: pafs.FileSystem, path: str) -> pa.Schema:
    """The Arrow schema of ``path``, with its key-value metadata (e.g. ``classes``)."""
    return footer(fs, path).schema.to_arrow_schema()


def num_rows(fs: pafs.FileSystem, path: str) -> int:
    return footer(fs, path).num_rows


def read_columns(fs: pafs.FileSystem, path: str, columns: list[str], row_group: int | None = None) -> pa.Table:
    """``columns`` of ``path`` (of one ``row_group`` when given), without reading its footer again."""
    f = pq.ParquetFile(path, filesystem=fs, metadata=footer(fs, path))
    return f.read(columns=columns) if row_group is None else f.read_row_group(row_group, columns=columns)


def column_bytes(fs: pafs.FileSystem, path: str, columns: set[str], rows: int | None = None) -> float:
    """The bytes ``columns`` of ``path`` hold read (their column chunks' uncompressed size, over every row group; a
    struct column's fields count for it), or their share in ``rows`` of its rows, from the footer: no data page
    read."""
    meta = footer(fs, path)
    size = sum(group.column(j).total_uncompressed_size for group in map(meta.row_group, range(meta.num_row_groups))
               for j in range(group.num_columns) if group.column(j).path_in_schema.split(".")[0] in columns)
    return size if rows is None else size * rows / max(meta.num_rows, 1)
