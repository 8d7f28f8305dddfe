"""The order a worker reads its share of a training split in, an epoch at a time (``set_epoch``).

Items read one at a time (image files, arrays) take torch's ``DistributedSampler``: a seeded permutation, strided
over the ranks. Items read a block at a time (a Parquet file's rows: ``blocks``) take ``BlockSampler``: there a
permutation would read every file for each image, or keep every file read (a whole ImageNet's bytes in every
DataLoader process). ``BlockSampler`` shuffles the blocks, then the items within windows of ``window`` blocks, and
gives rank r the r-th contiguous share; with the DataLoader's batch size and process count, it deals the share's
batches so that each process reads its own blocks, once an epoch, holding at most two windows of them.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import Dataset, DistributedSampler, Sampler

from ropim.data.blocks import WINDOW


class BlockSampler(Sampler[int]):
    """``DistributedSampler``'s contract (``n // num_replicas`` items a rank, seeded per ``set_epoch``, the ranks'
    shares disjoint) for a split read in blocks starting at ``offsets`` (the item count last). With ``batch`` and
    ``processes`` (those of the DataLoader that reads it), batch k of the share comes from the (k mod processes)-th
    contiguous part of it: the part a process reads, since a DataLoader gives its processes the batches in turn."""

    def __init__(self, offsets: np.ndarray, num_replicas: int, rank: int, seed: int = 0, window: int = WINDOW,
                 batch: int = 1, processes: int = 0) -> None:
        self.offsets, self.num_replicas, self.rank, self.seed = np.asarray(offsets), num_replicas, rank, seed
        self.window, self.batch, self.processes, self.epoch = window, batch, processes, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return int(self.offsets[-1]) // self.num_replicas

    def __iter__(self):
        rng = np.random.default_rng([self.seed, self.epoch])
        blocks = rng.permutation(len(self.offsets) - 1)
        windows = [np.concatenate([np.arange(self.offsets[b], self.offsets[b + 1]) for b in blocks[w:w + self.window]])
                   for w in range(0, len(blocks), self.window)]
        order = np.concatenate([rng.permutation(items) for items in windows])
        share = order[self.rank * len(self):(self.rank + 1) * len(self)]
        return iter(share[dealt(len(share), self.batch, self.processes)].tolist())


def dealt(count: int, batch: int, processes: int) -> np.ndarray:
    """Positions 0…count-1 reordered so that batch k (of ``batch`` items) comes from the (k mod ``processes``)-th
    contiguous part: a DataLoader gives its processes the batches in turn, so each reads its own part (its own
    blocks, where items are read in blocks). The last, partial batch's items stay last; 0 or 1 process: in order."""
    if processes < 2:
        return np.arange(count)
    parts = np.array_split(np.arange(count // batch), processes)  # the longer ones first
    turns = [part[turn] for turn in range(len(parts[0])) for part in parts if turn < len(part)]
    return np.concatenate([np.arange(k * batch, (k + 1) * batch) for k in turns]
                          + [np.arange(len(turns) * batch, count)]).astype(np.int64)


def contiguous_share(count: int, rank: int, world: int) -> range:
    """Rank ``rank``'s share of ``count`` items for an evaluation: contiguous (so that, read in blocks, each block is
    read by one rank), the shares' sizes differing by one at most."""
    return range(rank * count // world, (rank + 1) * count // world)


def sample(count: int, n: int | None, seed: int = 0) -> np.ndarray:
    """The positions of a seeded sample of ``n`` of ``count`` items (all of them when ``n`` is None or ≥ ``count``),
    ascending: read in blocks, each block is read once. The same ``count``, ``n`` and ``seed`` give the same sample."""
    if n is None or n >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).choice(count, n, replace=False))


def train_sampler(dataset: Dataset, num_replicas: int, rank: int, seed: int, batch: int = 1,
                  processes: int = 0) -> Sampler[int]:
    """A worker's order over ``dataset`` (reshuffled per ``set_epoch``, ``n // num_replicas`` items): a
    ``BlockSampler`` where the data set reads in blocks (``blocks()``), else a ``DistributedSampler``."""
    blocks = getattr(dataset, "blocks", lambda: None)()
    if blocks is None:
        return DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed,
                                  drop_last=True)
    return BlockSampler(blocks, num_replicas, rank, seed, batch=batch, processes=processes)
