"""Why a Ray Train run failed outside the job's code, in one line (``failure_reason``). No Ray imported here."""

from __future__ import annotations

import re

OUT_OF_MEMORY = ("OUT_OF_MEMORY", "running low on memory")  # how Ray words its memory monitor's kills
# Ray 2.60's raylet: "Memory on the node (IP: …, ID: …) was 7.61GB used / 8.00GB limit (0.951)"
NODE_MEMORY = re.compile(r"was (\d[\d.]*\s*[KMGT]?i?B)(?: used)? / (\d[\d.]*\s*[KMGT]?i?B)")


def failure_reason(err: BaseException) -> str:
    """Why a Ray Train run failed, in one line: what failed (Ray Train's controller, a Ray actor of the run) and Ray's
    reason (its memory monitor's kill, with the node's memory then; a process exit; else the error's first line)."""
    inner = getattr(err, "controller_failure", None)
    text = str(inner if inner is not None else err)
    actor = re.search(r"class_name: (\w+)", text)
    what = ("Ray Train's controller failed" if inner is not None else
            f"Ray actor {actor.group(1)} died" if actor else type(err).__name__)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    if type(inner or err).__name__ == "OutOfMemoryError" or any(marker in text for marker in OUT_OF_MEMORY):
        used = NODE_MEMORY.search(text)
        why = "killed by Ray's memory monitor, the node ran low on memory" + (
            f" ({used.group(1)} of {used.group(2)} in use)" if used else "")
    elif exit_type:
        why = f"its process exited ({exit_type.group(1)})"
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().endswith(":")]
        why = (lines or [type(inner or err).__name__])[0][:300]
    return f"{what}: {why}"
