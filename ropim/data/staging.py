"""A shuffled conversion of a Parquet source, in two passes with bounded memory (``ropim data convert``).

Written shard by shard in a shuffled order, every shard would read from every source shard: the source's bytes read
once per shard written. So the rows go through ``DST/.ropim_staging`` instead:

1. *stage*: each source shard is read once; its rows' encoded columns go to one staging file, ordered by the round
   that writes them (``STAGED`` in its metadata: the round layout and each round's row count);
2. *write*: a round (consecutive shards of a split holding at most ``ROUND_BYTES`` of encoded data, one shard at
   least) reads its rows from every staging file into its list's ``held``, and its shards are written as an
   unshuffled conversion writes them.

A staging file is written under a temporary name and renamed when complete, so a killed run keeps what it staged, as
it keeps the shards it wrote; the folder is removed once every shard is written. Meanwhile the destination holds the
source's encoded bytes twice. pyarrow and numpy only.
"""

from __future__ import annotations

import json
import posixpath
import sys
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from tqdm import tqdm

from ropim.data.destination import STAGING, temporary
from ropim.data.formats.parquet_rows import ERRORS, ParquetList, ParquetSegList, read_encoded

STAGED = b"ropim.staged"  # a staging file's layout, in its schema metadata
Listed = ParquetList | ParquetSegList
ROUND_BYTES = 1 << 30  # encoded bytes a round holds in memory, at most (a round holds one shard at least)


def encoded_bytes(items: Listed) -> float:
    """The bytes of ``items``' encoded columns, from the source footers (no data page read)."""
    return items.kept_bytes(len(items.files))


def shards_per_round(items: Listed, shard_size: int) -> int:
    """How many shards of ``items`` a round writes: their encoded bytes within ``ROUND_BYTES``, one shard at least."""
    per_shard = encoded_bytes(items) / max(len(items), 1) * shard_size
    return max(1, int(ROUND_BYTES // max(per_shard, 1.0)))


def staged_shards(fs: pafs.FileSystem, root: str, lists: dict[str, Listed], plans: dict, keep: set[str],
                  progress: bool) -> Iterator[str]:
    """Stage what is not staged yet (now: one progress bar, before the shards' own), then the names of the shards
    still to write, in the plan's order, each yielded while its items' encoded columns are held by its split's list;
    the staging folder is removed after the last. ``plans``: ``ropim.data.convert.plan_shards``'s (in split, then
    shard order); ``keep``: the shards a re-run keeps."""
    folder = posixpath.join(root, STAGING)
    fs.create_dir(folder, recursive=True)
    for info in fs.get_file_info(pafs.FileSelector(folder)):
        if temporary(info):
            fs.delete_file(info.path)  # left by a killed run
    staged = []
    for split, items in lists.items():
        names = [n for n, p in plans.items() if p[0] == split]
        if all(n in keep for n in names):
            continue
        per_round = shards_per_round(items, plans[names[0]][2]["shard_size"])
        of = np.empty(len(items), np.int64)  # the round writing each item
        for k, name in enumerate(names):
            of[plans[name][1]] = k // per_round
        staged.append((items, names, per_round, stage(fs, folder, split, items, of, per_round, progress)))
    return rounds(fs, folder, staged, keep)


def rounds(fs: pafs.FileSystem, folder: str, staged: list[tuple[Listed, list[str], int, list[str]]],
           keep: set[str]) -> Iterator[str]:
    """The shards of each staged split (its list, shard names, shards per round, staging files) still to write,
    a round at a time, each yielded while the round's items are held; then the staging ``folder`` is removed."""
    for items, names, per_round, files in staged:
        for r in range(-(-len(names) // per_round)):
            todo = [n for n in names[r * per_round:(r + 1) * per_round] if n not in keep]
            if todo:
                items.held = held(fs, files, r, list(items.COLUMNS))
                yield from todo
                items.held = {}
    fs.delete_dir(folder)


def stage(fs: pafs.FileSystem, folder: str, split: str, items: Listed, of: np.ndarray, per_round: int,
          progress: bool) -> list[str]:
    """Stage every source shard of ``items`` not staged with this layout yet (``of``: each item's round); the
    staging files, one per source shard holding rows of the split."""
    cols, rounds = list(items.COLUMNS), int(of.max(initial=0)) + 1
    staged = []
    for f in tqdm(range(len(items.files)), desc=f"stage {split}", unit="shard", disable=not progress,
                  file=sys.stdout):  # as convert's own bar: stderr stays for errors
        start, stop = int(items.offsets[f]), int(items.offsets[f + 1])
        if start == stop:
            continue
        path = posixpath.join(folder, f"{split}-{f:05d}.parquet")
        staged.append(path)
        by_round = np.argsort(of[start:stop], kind="stable")
        layout = {"per_round": per_round, "counts": np.bincount(of[start:stop], minlength=rounds).tolist()}
        if stored_layout(fs, path) == layout:
            continue
        rows = pa.array(items.rows[f][by_round])
        out = pa.table({"item": pa.array(np.arange(start, stop)[by_round]),
                        **{c: v.take(rows) for c, v in read_encoded(items.fs, items.files[f], cols).items()}})
        tmp = posixpath.join(folder, f".{posixpath.basename(path)}.tmp")
        pq.write_table(out.replace_schema_metadata({STAGED: json.dumps(layout).encode()}), tmp, filesystem=fs,
                       row_group_size=max(layout["counts"]))
        fs.move(tmp, path)
    return staged


def stored_layout(fs: pafs.FileSystem, path: str) -> dict | None:
    """The layout a complete staging file was written with; None when there is none."""
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    try:
        return json.loads(pq.read_schema(path, filesystem=fs).metadata[STAGED])
    except (*ERRORS, KeyError, TypeError, ValueError):
        return None


def held(fs: pafs.FileSystem, files: list[str], r: int, cols: list[str]) -> dict[int, bytes | tuple[bytes, ...]]:
    """{item: its encoded column(s)} of round ``r``, from every staging file (only the row groups holding it)."""
    out: dict[int, bytes | tuple[bytes, ...]] = {}
    for path in files:
        f = pq.ParquetFile(path, filesystem=fs)
        counts = json.loads(f.schema_arrow.metadata[STAGED])["counts"]
        start, stop, at, groups = sum(counts[:r]), sum(counts[:r + 1]), 0, []
        for g in range(f.metadata.num_row_groups):
            n = f.metadata.row_group(g).num_rows
            if at < stop and at + n > start:
                groups.append((g, at))
            at += n
        if not groups:
            continue
        part = f.read_row_groups([g for g, _ in groups]).slice(start - groups[0][1], stop - start)
        values = [part[c].to_pylist() for c in cols]
        for k, item in enumerate(part["item"].to_pylist()):
            out[item] = values[0][k] if len(cols) == 1 else tuple(v[k] for v in values)
    return out
