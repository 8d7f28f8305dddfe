"""ropim.checks: the CPU share that leaves Ray Data its CPU is the share the ray_data check accepts and names."""

from __future__ import annotations

import pytest

from ropim.checks import check_data_cpus, data_cpu_share
from ropim.errors import ConfigError


@pytest.mark.parametrize(("cpus", "workers", "share"), [(2, 2, 0.5), (2, 1, 1.0), (8, 2, 3.5), (8, 8, 0.87),
                                                         (3, 4, 0.5), (1, 1, 0.0), (16, 3, 5.0), (4, 2, 1.5)])
def test_the_share_is_the_largest_the_ray_data_check_accepts(cpus, workers, share):
    assert data_cpu_share(cpus, workers) == share
    if share:
        check_data_cpus(cpus, workers, share, "here")
        with pytest.raises(ConfigError, match=f"use --cpus_per_worker {share:g}"):
            check_data_cpus(cpus, workers, share + 0.01, "here")
