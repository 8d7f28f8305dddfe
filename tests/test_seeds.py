"""ropim.seeds: one mixer gives every (run seed, epoch or step, rank) a seed of its own, the same every time."""

from __future__ import annotations

import itertools

from ropim.seeds import derived_seed


def test_every_triple_a_run_meets_gets_its_own_63_bit_seed():
    triples = list(itertools.product(range(4), range(300), range(16)))
    seeds = [derived_seed(*t) for t in triples]
    assert len(set(seeds)) == len(triples)
    assert all(0 <= s < 2**63 for s in seeds)
    assert [derived_seed(*t) for t in triples[:50]] == seeds[:50]
    assert derived_seed(2**40, 10**6, 255) != derived_seed(2**40, 10**6, 254)
