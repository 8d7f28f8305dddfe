"""Ray workers of a local cluster that ropim starts run at the driver's priority, not Ray's nice 15 (beside a busy
process a nice-15 worker gets ~3 % of a core), unless the user sets RAY_worker_niceness."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ropim.train.niceness import NICENESS_VARIABLE, even_worker_priority

SCRIPT = """
import os, ray
from ropim.train.runtime import ray_session
with ray_session():
    print("worker", ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote()), "driver", os.nice(0))
"""


@pytest.mark.cluster
def test_workers_of_a_cluster_ropim_starts_run_at_the_drivers_priority(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (NICENESS_VARIABLE, "RAY_ADDRESS")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("worker"))
    _, worker, _, driver = line.split()
    assert worker == driver, line  # Ray alone: worker 15, driver 0


def test_a_users_own_niceness_wins(monkeypatch):
    monkeypatch.setenv(NICENESS_VARIABLE, "7")
    even_worker_priority()
    assert os.environ[NICENESS_VARIABLE] == "7"
    monkeypatch.delenv(NICENESS_VARIABLE)
    even_worker_priority()
    assert os.environ[NICENESS_VARIABLE] == "0"
