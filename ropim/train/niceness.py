"""The CPU priority of the Ray workers of a cluster that ropim starts on this machine.

Ray lowers every worker process to nice 15 (its ``worker_niceness`` setting): below the driver and below anything
else the user runs. Beside one busy process at normal priority a nice-15 worker gets about 3 % of a core (the
kernel's weights: 36 against 1,024), so a 2-worker pretraining on a laptop that is also compiling or browsing all
but stops (README "Speed on CPUs": the demo beside a busy process). A local cluster that ropim starts runs its
workers at the driver's priority instead; a cluster joined by address keeps its own setting (``ray start`` reads
``RAY_worker_niceness`` on each node), and a user's own ``RAY_worker_niceness`` wins.
"""

from __future__ import annotations

import os

NICENESS_VARIABLE = "RAY_worker_niceness"


def even_worker_priority() -> None:
    """Have the workers of the next local Ray cluster this process starts run at its own priority, unless the
    environment already sets ``RAY_worker_niceness``."""
    os.environ.setdefault(NICENESS_VARIABLE, "0")
