"""The Parquet format's item lists: the rows of shards a split selected, read a file at a time and kept a few files
at a time (``KEPT_FILES``), as a training order reads them (``ropim.data.sampling``). No torch, no Ray, no MLflow."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from ropim.data import footers
from ropim.data.lists import ImageList
from ropim.data.pair_lists import SegList
from ropim.errors import DataError, first_line

ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises on a file cut short or not Parquet


def unreadable(location: str, file: str, err: Exception) -> DataError:
    """The one error for a shard that cannot be read as Parquet, naming it and the fix."""
    return DataError(f"data source {location!r}: {file} cannot be read as Parquet ({first_line(err)}); it is cut "
                     "short or not a Parquet file: delete it and run the same `ropim data convert` again (it writes "
                     "the shards that are missing), or move it out of the data set")


def encoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The encoded images of an ``image`` / ``mask`` column: itself, or a Hugging Face ``Image`` struct's ``bytes``."""
    return pc.struct_field(column, "bytes") if pa.types.is_struct(column.type) else column


def read_encoded(fs: pafs.FileSystem, path: str, columns: list[str], **kwargs) -> dict[str, pa.ChunkedArray]:
    """The encoded ``columns`` (``encoded``) of shard ``path`` (``kwargs``: ``footers.read_columns``'s); a shard that
    cannot be read is ``unreadable``, naming it."""
    try:
        table = footers.read_columns(fs, path, columns, **kwargs)
    except ERRORS as err:
        raise unreadable(path, path, err) from None
    return {c: encoded(table[c]) for c in columns}


KEPT_FILES = 4  # files a list keeps read: twice the blocks a training order reads together (ropim.data.sampling)


def kept(cache: dict, f: int, size: int, read: Callable[[], object]):
    """``cache[f]``, read first when it is not there; the entry read longest ago is dropped to keep ``size``."""
    if f not in cache:
        if len(cache) >= size:
            cache.pop(next(iter(cache)))
        cache[f] = read()
    return cache[f]


def row_name(file: str, row: int) -> str:
    """The name a listing gives a row whose shard has no ``path`` (messages name it; a conversion writes null)."""
    return f"{file}#{row}"


class ShardRows:
    """Selected rows of Parquet shards (``files``, the ``rows`` taken of each), whose encoded ``COLUMNS`` are read a
    file at a time, on first use, and kept (``cache_files`` files; default ``KEPT_FILES``): a training order reads
    the files a few at a time (``blocks``: ``ropim.data.sampling.BlockSampler``), so that no process holds the whole
    data set's bytes. What ``ParquetList`` (images) and ``ParquetSegList`` (pairs) share."""

    COLUMNS: tuple[str, ...] = ("image",)

    def take_rows(self, fs, files: list[str], rows: list[np.ndarray], cache_files: int | None) -> None:
        """Set the shards, their rows and the files kept (an ``__init__``'s part)."""
        self.fs, self.files, self.rows, self.cache_files = fs, files, rows, cache_files or KEPT_FILES
        self.offsets = np.cumsum([0] + [len(r) for r in rows])
        self.cache: dict[int, object] = {}
        self.held: dict[int, object] = {}  # items read already (a shuffled conversion's round)

    def blocks(self) -> np.ndarray:
        return self.offsets

    def shard_of(self, i: int) -> tuple[int, int]:
        """(the file holding item ``i``, its position among the rows taken of that file)."""
        f = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return f, i - int(self.offsets[f])

    def stored_path(self, i: int) -> str | None:
        """Item ``i``'s ``path`` column: None where its shard has none (listed as ``file#row``, for messages). A
        conversion keeps it null, so that readers of the copy split it by its bytes, as they split the source."""
        f, j = self.shard_of(i)
        path = self.paths[i]
        return None if path == row_name(self.files[f], self.rows[f][j]) else path

    def first_rows(self, k: int) -> tuple[list[int], dict[str, pa.ChunkedArray]]:
        """(up to ``k`` of the first items, their encoded columns) from the first row group of the first shard that
        holds any of them: one row group is read (256 rows in shards ``ropim data convert`` writes), not the shard."""
        f = next((j for j, rows in enumerate(self.rows) if len(rows)), None)
        if f is None:
            return [], {}
        group = read_encoded(self.fs, self.files[f], list(self.COLUMNS), row_group=0)
        rows = self.rows[f][self.rows[f] < len(group[self.COLUMNS[0]])][:k]  # ascending: the shard's first items
        taken = pa.array(rows)
        return [int(self.offsets[f]) + j for j in range(len(rows))], {c: v.take(taken) for c, v in group.items()}

    def kept_bytes(self, files: int | None = None) -> int:
        """The most encoded bytes a process reading this list keeps: the rows taken from its ``files`` (default:
        ``cache_files``) largest shards (from the footers)."""
        sizes = sorted(footers.column_bytes(self.fs, f, set(self.COLUMNS), len(rows))
                       for f, rows in zip(self.files, self.rows, strict=True))
        return int(sum(sizes[-(files or self.cache_files):]))

    def fingerprint(self) -> bytes:
        """Each shard's path, size and modification time, and the rows taken from it (no data page read)."""
        return b"".join(f"{info.path}\0{info.size}\0{info.mtime_ns}\n".encode()
                        + np.ascontiguousarray(rows, dtype=np.int64).tobytes()
                        for info, rows in zip(self.fs.get_file_info(self.files), self.rows, strict=True))

    def __getstate__(self):  # workers (DataLoader, Ray) read their own copy
        return {**self.__dict__, "cache": {}, "held": {}}


class ParquetList(ShardRows, ImageList):
    """A split's images in Parquet shards (``ShardRows``)."""

    def __init__(self, fs, files: list[str], rows: list[np.ndarray], labels, paths, classes,
                 cache_files: int | None = None) -> None:
        super().__init__(labels, paths, classes)
        self.take_rows(fs, files, rows, cache_files)

    def column(self, f: int, name: str, **kwargs) -> pa.ChunkedArray:
        return read_encoded(self.fs, self.files[f], [name], **kwargs)[name]

    def load(self, i: int) -> bytes:
        if i in self.held:
            return self.held[i]
        f, j = self.shard_of(i)
        images = kept(self.cache, f, self.cache_files, lambda: self.column(f, "image").take(pa.array(self.rows[f])))
        return images[j].as_py()

    def head(self, k: int) -> list[tuple[str, bytes]]:
        """(path, bytes) of up to ``k`` of the first images (``first_rows``: one row group read)."""
        items, columns = self.first_rows(k)
        return [(self.paths[i], data) for i, data in zip(items, columns.get("image", pa.array([])).to_pylist(),
                                                           strict=True)]


class ParquetSegList(ShardRows, SegList):
    """A split's pairs in Parquet shards (``ShardRows``: ``image`` and ``mask``)."""

    COLUMNS = ("image", "mask")

    def __init__(self, fs, files: list[str], rows: list[np.ndarray], paths: Iterable[str], num_classes: int,
                 cache_files: int | None = None) -> None:
        super().__init__(paths, num_classes)
        self.take_rows(fs, files, rows, cache_files)

    def read(self, f: int) -> dict[str, list]:
        rows, columns = pa.array(self.rows[f]), read_encoded(self.fs, self.files[f], list(self.COLUMNS))
        return {c: v.take(rows).to_pylist() for c, v in columns.items()}

    def sample(self, k: int) -> list[int]:
        """Up to ``k`` of the first pairs (``first_rows``: one row group read, not every shard a spread sample would
        read whole), held: loading them reads nothing more."""
        items, columns = self.first_rows(k)
        if items:
            self.held.update(zip(items, zip(*(columns[c].to_pylist() for c in self.COLUMNS), strict=True), strict=True))
        return items

    def raw(self, i: int) -> tuple[bytes, bytes]:
        if i in self.held:
            return self.held[i]
        f, j = self.shard_of(i)
        pairs = kept(self.cache, f, self.cache_files, lambda: self.read(f))
        return pairs["image"][j], pairs["mask"][j]
