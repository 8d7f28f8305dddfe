"""What a user installs: the wheel holds every preset and file the package reads, runs from a plain install (not
the source tree), carries the licence."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.slow  # builds and installs the wheel, then pretrains from it: a release check


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the tracked sources: a build in the checkout would leave build/ there, and a stale
    build/ would put files in the wheel that the sources no longer have."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src") / "ropim"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out)], check=True, capture_output=True, text=True, timeout=300)
    return next(out.glob("ropim-*.whl"))


def test_wheel_holds_every_preset_data_file_and_the_licence(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {str(p.relative_to(ROOT)) for top in ("ropim", "tune") for p in (ROOT / top).rglob("*.yaml")}
    assert shipped and shipped <= names, shipped - names
    assert {"ropim/tracking/mlflow_encoder.py", "ropim/tracking/mlflow_classifier.py"} <= names
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry_points = zipfile.ZipFile(wheel).read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert "sweep = tune.sweep:COMMAND" in entry_points and "ropim = ropim.cli:main" in entry_points


def test_installed_wheel_lists_presets_and_pretrains(wheel, tmp_path):
    """A non-editable install (the wheel into its own folder, dependencies from this environment) away from the
    source tree: presets resolve from the package, a short pretraining runs and registers."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    where = subprocess.run([sys.executable, "-c", "import ropim, tune; print(ropim.__file__, tune.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert where.count(str(target)) == 2  # the installed copy, not the checkout
    listed = subprocess.run([sys.executable, "-m", "ropim.cli", "presets"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert "pretrain/digits_demo" in listed.stdout and "sweep/rho_ablation" in listed.stdout, listed.stderr
    run = subprocess.run([sys.executable, "-m", "ropim.cli", "pretrain", "--preset", "digits_demo", "--epochs", "1",
                          "--max_steps_per_epoch", "2", "--num_workers", "0", "--viz_every", "0", "--model.depth", "1",
                          "--global_batch_size", "16", "--eval_every", "0"],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip().splitlines()[-1] == "models:/ropim-encoder/1"

