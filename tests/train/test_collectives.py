"""``ropim.train.collectives`` over a 2-process gloo group (Ray Train's CPU workers use the same calls): a sum is
every worker's values added, on every worker."""

from __future__ import annotations

import torch
from support import gloo_rank, on_two_ranks

from ropim.train.collectives import gathered, summed


def two_rank_sums(rank: int, init: str, out) -> None:
    """Rank ``rank`` of 2: sums and gathers rank-dependent counts; puts them or the error."""
    with gloo_rank(rank, init, out):
        counts = torch.arange(6, dtype=torch.int64) * (rank + 1) + 10**12 * rank  # past float32's exact integers
        out.put((rank, summed(counts, 2, torch.device("cpu")).tolist(), gathered(counts, 2, torch.device("cpu"))))


def test_a_sum_over_two_workers_is_every_workers_counts_added_exactly(tmp_path):
    got = on_two_ranks(two_rank_sums, tmp_path)
    assert all(isinstance(got[rank][0], list) for rank in (0, 1)), got  # else a worker's traceback
    expected = [3 * i + 10**12 for i in range(6)]
    assert got[0][0] == got[1][0] == expected  # on every worker, exact
    assert got[0][1].sum(0).tolist() == expected  # what gathering then adding gave, at a world's size on the wire
    original = torch.arange(3)
    assert summed(original, 1, torch.device("cpu")).tolist() == [0, 1, 2]  # one worker: its own, a copy
