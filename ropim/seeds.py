"""The one seed mixer: how a run's seed becomes the seed of one worker's epoch or step."""

from __future__ import annotations


def derived_seed(seed: int, counter: int, rank: int) -> int:
    """A 63-bit seed of (run ``seed``, ``counter``: an epoch or a step, worker ``rank``), distinct for each triple a
    run meets: the loop's augmentation seed per epoch, a step's sketch, Ray Data's local shuffle per epoch."""
    return ((seed * 1_000_003 + rank) * 1_000_000_007 + counter) % 2**63
