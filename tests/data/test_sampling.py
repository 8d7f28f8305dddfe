"""``ropim.data.sampling``: a split read in blocks (Parquet files) is shuffled block-wise, each rank gets its equal,
disjoint share, and a DataLoader's processes each read their own blocks; other splits keep torch's
``DistributedSampler``."""

from __future__ import annotations

import numpy as np
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, get_worker_info

from ropim.data.blocks import WINDOW, mixing_note
from ropim.data.sampling import BlockSampler, dealt, sample, train_sampler

SIZES = [7, 5, 9, 3, 8, 6, 10, 4, 5, 7]  # items of each of 10 blocks: 64 in all
OFFSETS = np.cumsum([0, *SIZES])


def block_of(items) -> set[int]:
    return {int(np.searchsorted(OFFSETS, i, side="right")) - 1 for i in items}


def test_each_rank_gets_an_equal_disjoint_share_reshuffled_per_epoch():
    shares = []
    for rank in range(3):
        sampler = BlockSampler(OFFSETS, 3, rank, seed=1)
        sampler.set_epoch(4)
        share = list(sampler)
        assert len(share) == len(sampler) == 64 // 3 and share == list(sampler)  # seeded by (seed, epoch)
        sampler.set_epoch(5)
        assert sorted(list(sampler)) != sorted(share)  # another epoch: other blocks to each rank
        shares.append(share)
    every = [i for share in shares for i in share]
    assert len(set(every)) == len(every) == 63 and all(0 <= i < 64 for i in every)
    # a rank reads a third of the blocks and the windows cut at its share's ends, not every block
    assert all(len(block_of(share)) <= 10 // 3 + 2 * WINDOW for share in shares)


def test_a_loaders_processes_each_read_their_own_blocks():
    one = BlockSampler(OFFSETS, 1, 0, seed=0)
    dealt = BlockSampler(OFFSETS, 1, 0, seed=0, batch=4, processes=2)
    order = list(dealt)
    assert sorted(order) == sorted(one) and order != list(one)  # the same items, batches dealt to the processes
    batches = [order[k:k + 4] for k in range(0, 64, 4)]
    read = [block_of(i for b in batches[p::2] for i in b) for p in range(2)]  # a DataLoader deals batches in turn
    assert len(read[0] & read[1]) <= 1 and len(read[0] | read[1]) == 10  # before: both processes read every block


def test_items_read_alone_keep_torchs_distributed_sampler():
    assert isinstance(train_sampler(range(10), 2, 0, seed=0), DistributedSampler)


def test_shards_in_class_order_are_warned_of():
    from types import SimpleNamespace

    labels = np.repeat(np.arange(8), 8)  # 8 shards of 8 images, each one class
    blocks, classes = np.arange(0, 65, 8), [str(c) for c in range(8)]
    note = mixing_note(SimpleNamespace(blocks=lambda: blocks, labels=labels, classes=classes))
    assert note and "median 12%" in note and "ropim data convert" in note
    shuffled = np.random.default_rng(0).permutation(labels)
    assert mixing_note(SimpleNamespace(blocks=lambda: blocks, labels=shuffled, classes=classes)) is None
    assert mixing_note(SimpleNamespace(labels=labels, classes=classes)) is None  # read image by image


class Reader(Dataset):
    """4,000 items in blocks of 1,000; an item is its index and the DataLoader process that read it."""

    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, get_worker_info().id


def blocks_read(order) -> list[set[int]]:
    """The blocks each of 2 DataLoader processes read, batches of 250 in ``order``."""
    read = [set(), set()]
    for items, process in DataLoader(Subset(Reader(), list(order)), batch_size=250, num_workers=2):
        read[int(process[0])] |= {int(i) // 1000 for i in items}
    return read


def test_dealt_batches_give_each_loader_process_its_own_blocks():
    in_turn = blocks_read(range(4000))  # a DataLoader gives its processes the batches in turn
    assert in_turn == [{0, 1, 2, 3}, {0, 1, 2, 3}]  # both read every block
    own = blocks_read(dealt(4000, 250, 2))
    assert own == [{0, 1}, {2, 3}] and sorted(dealt(4000, 250, 2)) == list(range(4000))
    assert list(dealt(10, 4, 1)) == list(range(10)) and sorted(dealt(10, 4, 3)) == list(range(10))


def test_a_sample_is_seeded_ascending_and_distinct():
    picked = sample(1000, 100)
    assert len(set(picked.tolist())) == 100 and (np.diff(picked) > 0).all() and picked.max() < 1000
    assert (picked == sample(1000, 100)).all() and not (picked == sample(1000, 100, seed=1)).all()
    assert (sample(50, None) == np.arange(50)).all() and (sample(50, 80) == np.arange(50)).all()
