"""What every CPU benchmark records beside its measurements (when, the command that reproduces it, how long, how
busy the machine was at the end), and how it writes its JSON."""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path


def provenance(script: str, argv: list[str] | None, t0: float) -> dict:
    """``date``, ``command`` (``python <script> <args>``, the arguments of ``argv`` or of this process), ``wall_s``
    since ``t0`` (a ``time.perf_counter()`` reading) and ``load_avg_end``."""
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)]),
                wall_s=time.perf_counter() - t0, load_avg_end=list(os.getloadavg()))


def write_json(report: dict, out: Path) -> None:
    """Write ``report`` to ``out`` (folders made as needed)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


def side_by_side(what: str, runs: dict[str, tuple[str, dict, float]]) -> dict:
    """Print two ``runs`` (key → (label, scores, seconds)) as a table, then the first's seconds over the second's;
    return them for the JSON: {key: {"seconds", "scores"}, …, "speedup"}."""
    print(f"{what:<28}{'seconds':>9}  scores")
    for label, scores, seconds in runs.values():
        print(f"{label:<28}{seconds:>9.1f}  {scores}")
    (_, _, first), (_, _, second) = runs.values()
    print(f"speed-up: {first / second:.2f}x")
    return {**{key: {"seconds": seconds, "scores": scores} for key, (_, scores, seconds) in runs.items()},
            "speedup": first / second}
