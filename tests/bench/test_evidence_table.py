"""bench/evidence_table.py: the GPU evidence over its seeds, and the docs' table made from the committed results."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from support import bench_module

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def et():
    with bench_module("evidence_table") as module:
        yield module


def result(path: Path, seed: int, ropim: float, simmim: float, none: float = 40.0, device: str = "NVIDIA H100 80GB",
           complete: bool = True) -> Path:
    """A gpu_evidence.py JSON holding what the table reads."""
    def row(method: str, top1: float, pretrain_epochs: float | None, layer_decay: float | None = 0.75) -> dict:
        pretrain = None if pretrain_epochs is None else {"epochs": pretrain_epochs}
        return {"method": method, "layer_decay": layer_decay, "pretrain": pretrain,
                "finetune": {"top1": top1, "epochs": 7 + seed}}

    rows = [row("ROPIM", ropim, 39.26), row("SimMIM", simmim, 36.0), row("none", none, None, None)]
    path.write_text(json.dumps({"seed": seed, "device_name": device, "complete": complete, "rows": rows}))
    return path


def test_the_paired_comparison_is_seed_by_seed(et, tmp_path):
    # given in another order than their seeds; seed 2 is the one SimMIM wins
    files = [result(tmp_path / "c.json", 2, 50.0, 51.0), result(tmp_path / "a.json", 0, 56.0, 55.0),
             result(tmp_path / "b.json", 1, 54.5, 52.5, device="NVIDIA H200")]
    s = et.summarize(et.read(files))
    assert s["seeds"] == [0, 1, 2] and s["devices"] == ["H100", "H200", "H100"]
    assert s["methods"]["ROPIM"]["top1"] == [56.0, 54.5, 50.0]
    assert s["methods"]["none (no layer decay)"]["mean"] == 40.0
    diff = [1.0, 2.0, -1.0]
    p = s["paired"]
    assert p["diff"] == diff and p["leads"] == 2 and p["seeds"] == 3
    t = statistics.mean(diff) / (statistics.stdev(diff) / math.sqrt(3))
    assert p["t"] == pytest.approx(t) and 0 < p["t_p"] < 1
    table = et.markdown(s)
    assert "| ROPIM | 56.00 | 54.50 | 50.00 | 53.50 ± 3.12 |" in table
    assert "ROPIM leads in 2 of 3" in table
    assert "| ROPIM pretraining epochs | 39.3 | 39.3 | 39.3 | |" in table
    assert "| fine-tune epochs | 7 | 8 | 9 | |" in table  # seed by seed


@pytest.mark.parametrize("case, message", [
    ("twice", "seed 0 again"),
    ("methods", "different methods"),
    ("incomplete", "an incomplete run"),
    ("one", "at least 2"),
    ("cut", "not a gpu_evidence.py result"),
])
def test_a_bad_set_of_results_is_refused_in_one_line(et, tmp_path, case, message):
    first = result(tmp_path / "first.json", 0, 56.0, 55.0)
    other = tmp_path / "other.json"
    if case == "twice":
        result(other, 0, 55.0, 54.0)
    elif case == "methods":
        d = json.loads(result(other, 1, 55.0, 54.0).read_text())
        other.write_text(json.dumps({**d, "rows": d["rows"][:2]}))
    elif case == "incomplete":
        result(other, 1, 55.0, 54.0, complete=False)
    elif case == "cut":
        other.write_text(result(other, 1, 55.0, 54.0).read_text()[:80])  # a file cut short
    files = [first] if case == "one" else [first, other]
    with pytest.raises(SystemExit) as err:
        et.summarize(et.read(files))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_docs_table_is_the_committed_results():
    """docs/speed.md's table is what the script makes of bench/results/ (a new seed's JSON needs its column)."""
    out = subprocess.run([sys.executable, "bench/evidence_table.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    docs = (ROOT / "docs" / "speed.md").read_text()
    rows = [line for line in out.splitlines() if line.startswith("|")]
    assert len(rows) == 9 and all(line in docs for line in rows), out  # head, rule, 4 methods, 3 epoch rows
    paired = out.strip().splitlines()[-1]
    assert paired.startswith("ROPIM − SimMIM") and paired in " ".join(docs.split()), "docs/speed.md lacks " + paired
