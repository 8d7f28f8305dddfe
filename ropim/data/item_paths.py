"""A split's item paths in one Arrow string array instead of a list of Python strings.

A DataLoader process forked from the process that listed the split reads the paths it is handed; reading a Python
string writes its reference count, so each process ended up copying every page of the list: 118 MiB per process at
ImageNet-1k's 1.28 M paths, 7.5 GB on a node of 8 workers x 8 processes. An Arrow array's buffers are only read, so
the processes share them (``bench/path_memory.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np
import pyarrow as pa

CHUNK = 65_536  # paths turned into Python strings at a time when iterating


class ItemPaths(Sequence[str]):
    """Paths, one per item: ``paths[i]`` is a ``str``; ``paths[idx]`` (an index array or a slice) and ``a + b`` are
    ``ItemPaths`` again; equal to any sequence of the same strings."""

    def __init__(self, values: Iterable[str] | pa.Array | ItemPaths = ()) -> None:
        if isinstance(values, ItemPaths):
            self.array: pa.LargeStringArray = values.array
        elif isinstance(values, pa.Array):
            self.array = values.cast(pa.large_string())
        else:
            self.array = pa.array(list(values), pa.large_string())

    def __len__(self) -> int:
        return len(self.array)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice | np.ndarray) -> ItemPaths: ...

    def __getitem__(self, i):
        if isinstance(i, (int, np.integer)):
            return self.array[int(i)].as_py()
        if isinstance(i, slice):
            return ItemPaths(self.array[i])
        idx = np.asarray(i)
        return ItemPaths(self.array.take(np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64)))

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self.array), CHUNK):
            yield from self.array[start:start + CHUNK].to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ItemPaths):
            return self.array.equals(other.array)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking sequences are not hashed, as lists are not

    def __add__(self, other: Iterable[str]) -> ItemPaths:
        return joined([self, ItemPaths(other)])

    def __repr__(self) -> str:
        shown = ", ".join(repr(p) for p in self[:3])
        return f"ItemPaths([{shown}{', …' if len(self) > 3 else ''}], {len(self)} paths)"


def joined(parts: Sequence[ItemPaths]) -> ItemPaths:
    """The paths of ``parts`` one after another."""
    return ItemPaths(pa.concat_arrays([p.array for p in parts]))
