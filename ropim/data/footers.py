"""Parquet shards read through one door: each file's footer (schema, row groups, row count) is read once per process
and kept, keyed by the file's size and modification time (a file written again is read again); column reads reuse
it (``pq.ParquetFile(..., metadata=...)``), so a job reads every footer once, however many times its sources are
opened, checked, listed and evaluated. pyarrow only.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

FOOTERS: dict[tuple, pq.FileMetaData] = {}  # (filesystem kind, path, size, mtime) -> footer


def footer(fs: pafs.FileSystem, path: str) -> pq.FileMetaData:
    """The footer of ``path`` on ``fs``, read once while the file stays the same."""
    info = fs.get_file_info(path)
    key = (fs.type_name, path, info.size, info.mtime_ns)
    if key not in FOOTERS:
        FOOTERS[key] = pq.read_metadata(path, filesystem=fs)
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
