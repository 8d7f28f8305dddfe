"""bench/gpu_window.sh --tiny: every part of the GPU window runs on CPU and writes its JSON, in a Python where Ray,
MLflow, Optuna and jsonargparse cannot be imported, as on the GPU machine's image (make test-bench)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCKER = '''
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"ray", "mlflow", "optuna", "jsonargparse"}:
            raise ImportError(f"{name} is not installed on the GPU image")
sys.meta_path.insert(0, Absent())
'''

pytestmark = pytest.mark.bench


def test_tiny_window_on_an_image_without_ray_or_mlflow(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(tmp_path / "site")}
    proc = subprocess.run(["bench/gpu_window.sh", "--tiny"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 part(s) failed" in proc.stdout and (out / "gpu_window.log").read_text() == proc.stdout

    evidence = json.loads((out / "gpu_evidence.json").read_text())
    assert evidence["complete"] and [r["method"] for r in evidence["rows"]] == ["ROPIM", "SimMIM", "none", "none"]
    assert evidence["plan"]["finetune_epochs"] == 1  # the window's fixed fine-tune length
    for row in evidence["rows"]:
        assert 0 <= row["finetune"]["top1"] <= 100 and row["finetune"]["epochs"] == evidence["plan"]["finetune_epochs"]
    pretrained = [r["pretrain"] for r in evidence["rows"][:2]]
    assert all(p["steps"] >= 1 and math.isfinite(p["last_loss"]) for p in pretrained)
    assert pretrained[0]["steps"] == pretrained[1]["steps"] == 256 // 32  # the window's fixed pretraining: 1 epoch

    smoke = json.loads((out / "preset_smoke.json").read_text())
    assert {r["job"] for r in smoke["rows"]} == {"pretrain", "finetune", "graft", "segment"}
    for row in smoke["rows"]:
        assert "error" not in row and row["finite"], row
        assert row["step_s"] > 0 and row["peak_mib"] > 0 and row["checkpoint_mib"] > 0

    step = json.loads((out / "gpu_step.json").read_text())
    assert {(r["corruption"], r["variant"]) for r in step["rows"]} >= {("rop", "plain"), ("mask", "bf16")}
