"""bench/gpu_step.py --tiny on CPU, end to end: every row is measured or skipped with a reason, the table is printed
and the JSON written; the compile row runs too (traced by AOTAutograd, without inductor's C++ build)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
NUMBERS = ("ms_per_step", "ms_p25", "ms_p75", "img_per_s", "first_step_s", "peak_mem_mib", "gflop_per_img",
           "step_gflop_per_img", "speedup_vs_plain")


@pytest.fixture
def bench(monkeypatch, tmp_path, capsys):
    """Run gpu_step.main(--tiny ARGS): (the JSON report, stdout)."""
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location("gpu_step", BENCH / "gpu_step.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_step", module)
    spec.loader.exec_module(module)

    def run(*args: str) -> tuple[dict, str]:
        out = tmp_path / "gpu_step.json"
        returned = module.main(["--tiny", "--out", str(out), *args])
        assert json.loads(out.read_text()) == json.loads(json.dumps(returned))
        return returned, capsys.readouterr().out

    return run


def rows_of(report: dict) -> dict[tuple[str, str, str], dict]:
    rows = {(r["backbone"], r["corruption"], r["variant"]): r for r in report["rows"]}
    assert len(rows) == len(report["rows"])  # one row per configuration
    for key, r in rows.items():
        assert (r["model"], r["batch_size"], r["depth"]) == ("cpu", 4, 1), key
        for name in NUMBERS:
            assert isinstance(r[name], float) and math.isfinite(r[name]) and r[name] > 0, (key, name, r[name])
        assert r["mfu"] is None  # no CPU peak: MFU unknown, and said so
    assert "MFU unknown" in report["peak_source"] and "--tiny" in report["command"]
    return rows


def test_tiny_every_option_that_runs_on_cpu(bench):
    report, printed = bench()
    rows = rows_of(report)
    skipped = {(s["backbone"], s["corruption"], s["variant"]): s["reason"] for s in report["skipped"]}
    assert "x plain" in printed and "skipped: TF32" in printed
    for backbone in ("vit", "beit"):
        for corruption in ("rop", "mask", "none"):
            for variant in ("plain", "bf16", "fused", "channels_last", "all"):
                assert rows[(backbone, corruption, variant)]["settings"] is not None
            for variant in ("compile", "tf32", "pageable", "pinned"):
                assert skipped[(backbone, corruption, variant)]
            assert rows[(backbone, corruption, "plain")]["speedup_vs_plain"] == 1.0
            assert rows[(backbone, corruption, "all")]["settings"]["adamw"] == "fused"
        dense = rows[(backbone, "rop", "dense")]
        assert dense["step_gflop_per_img"] > dense["gflop_per_img"]  # the N×N matmuls cost FLOPs the scatter saves
        assert "rop only" in skipped[(backbone, "mask", "dense")]


def test_tiny_compile_row(bench):
    report, _ = bench("--options", "compile", "--backbones", "beit", "--corruptions", "rop", "mask",
                      "--compile-backend", "aot_eager")
    rows = rows_of(report)
    assert set(rows) == {("beit", c, v) for c in ("rop", "mask") for v in ("plain", "compile")}
    assert rows[("beit", "rop", "compile")]["settings"]["compile"] and report["compile_backend"] == "aot_eager"
