"""The command lines the shipped presets suggest in their comments ("… e.g. --flag value …") parse with the CLI, so
a renamed flag breaks this test rather than the user who copies the line."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

PRESETS = Path(__file__).resolve().parents[1] / "ropim" / "presets"


def suggested(path: Path) -> list[str] | None:
    """The flags after "e.g." in the preset's leading comment: the rest of that line and the comment lines after it
    that start with a flag, up to a parenthesis."""
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    for i, line in enumerate(comment):
        if "e.g." in line:
            parts = [line.split("e.g.", 1)[1]]
            for more in comment[i + 1:]:
                if not more.startswith("--"):
                    break
                parts.append(more)
            return shlex.split(" ".join(parts).split("(")[0])
    return None


CASES = [(p.parent.name, p.stem, flags) for p in sorted(PRESETS.glob("*/*.yaml")) if (flags := suggested(p))]


def test_some_presets_suggest_flags():
    assert {job for job, _, _ in CASES} >= {"finetune", "segment"}


@pytest.mark.parametrize(("job", "preset", "flags"), CASES, ids=[f"{j}/{p}" for j, p, _ in CASES])
def test_suggested_flags_parse(job: str, preset: str, flags: list[str]):
    assert all(f.startswith("--") for f in flags[::2]), flags  # --flag value pairs, nothing else
    proc = subprocess.run([sys.executable, "-m", "ropim.cli", job, "--preset", preset, *flags, "--print_config"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
