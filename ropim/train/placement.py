"""Where a run's workers go: the Ray placement strategy and the elastic lower bound ``min_workers``."""

from __future__ import annotations

from typing import Protocol

from ropim.checks import Range
from ropim.errors import ConfigError

PLACEMENTS = ("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK")  # Ray placement-group strategies


class Placed(Protocol):
    """A job config with workers to place (pretraining or fine-tuning)."""

    num_workers: int
    placement_strategy: str
    min_workers: int | None


def check_placement(job: Placed, batch: int, divisor: int = 1) -> None:
    """``placement_strategy`` is a Ray strategy; ``min_workers`` (elastic) lies in [1, num_workers] and the global
    batch ``batch`` splits evenly over it too (as over ``num_workers``). Counts in between take ``batch // workers``
    each: the global batch then shrinks by less than one micro batch, the step count and schedule stay."""
    if job.placement_strategy not in PLACEMENTS:
        raise ConfigError(f"placement_strategy={job.placement_strategy!r}: choose one of {', '.join(PLACEMENTS)}")
    if job.min_workers is None:
        return
    if not Range(1, job.num_workers, integer=True).holds(job.min_workers):
        raise ConfigError(f"min_workers={job.min_workers!r}: must be an integer in [1, num_workers={job.num_workers}]"
                          " (or null: always num_workers)")
    if batch % (job.min_workers * divisor):
        raise ConfigError(f"min_workers={job.min_workers}: the global batch of {batch} is not divisible by "
                          f"min_workers={job.min_workers}" + (f" × accum_steps={divisor}" if divisor > 1 else "")
                          + ", the worker count an elastic restart may fall back to")
