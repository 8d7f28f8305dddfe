"""The demo's table under each precision, over seeds: ``ropim demo`` (pretraining on 2 Ray workers, kNN, linear probe
and the 10-epoch fine-tune of the ROPIM encoder and of a random-init one) run as a user runs it, once per
(precision, seed), each in a fresh scratch folder with its own MLflow store. A precision ``P`` is set for the
pretraining and both fine-tunes (``--pretrain.precision`` / ``--finetune.precision``), ``P/F`` sets ``P`` for the
pretraining and ``F`` for the fine-tunes; the seed is set for both (``--pretrain.seed`` / ``--finetune.seed``).
Prints every cell's table row and wall time, then mean ± std per precision, and keeps the per-seed difference of
each score from the first precision: whether the faster default keeps the quality.

    PYTHONPATH=. python bench/demo_precision.py --precisions fp32 auto --seeds 0 1 2
    PYTHONPATH=. python bench/demo_precision.py --precisions fp32 auto/fp32 \
        --out bench/results/demo_precision_default.json

JSON in ``bench/results/demo_precision.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from record import provenance, write_json  # bench/, beside this file

from ropim.train.speed import cpu_features, resolve_precision

RESULTS = Path(__file__).resolve().parent / "results"
ROWS = {"ROPIM (pretrained here)": "ropim", "random init": "random"}
SCORES = ("knn_top1", "linear_top1", "finetune_top1")


def parse_table(stdout: str) -> dict[str, dict[str, float]]:
    """The demo's summary rows: {"ropim" | "random": {score: top-1}}."""
    out = {}
    for label, key in ROWS.items():
        m = re.search(rf"^{re.escape(label)}\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", stdout, re.M)
        if m is None:
            raise RuntimeError(f"no '{label}' row in the demo's output:\n{stdout[-3000:]}")
        out[key] = dict(zip(SCORES, map(float, m.groups()), strict=True))
    return out


def run_cell(precision: str, seed: int) -> dict:
    """One ``ropim demo`` in a scratch folder."""
    pre, _, fine = precision.partition("/")
    args = [sys.executable, "-m", "ropim.cli", "demo", "--pretrain.precision", pre, "--finetune.precision",
            fine or pre, "--pretrain.seed", str(seed), "--finetune.seed", str(seed)]
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the scratch folder's store
        t0 = time.perf_counter()
        done = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"ropim demo failed ({done.returncode}):\n{done.stderr[-3000:]}")
    table = parse_table(done.stdout)
    print(f"  {precision} seed {seed}: {wall:.0f} s  ROPIM " + " / ".join(f"{table['ropim'][s]:.2f}" for s in SCORES)
          + "  random " + " / ".join(f"{table['random'][s]:.2f}" for s in SCORES), flush=True)
    resolved = "/".join(resolve_precision(p, torch.device("cpu")) for p in (pre, fine or pre))
    return dict(precision=precision, resolved=resolved,
                seed=seed, wall_s=wall, **table)


def summary(cells: list[dict], precisions: list[str]) -> dict:
    """Mean ± std per (precision, encoder, score), and per-seed differences from the first precision."""
    out: dict = {}
    for p in precisions:
        for enc in ROWS.values():
            for s in SCORES:
                vals = [c[enc][s] for c in cells if c["precision"] == p]
                out[f"{p}.{enc}.{s}"] = dict(mean=statistics.mean(vals),
                                             std=statistics.stdev(vals) if len(vals) > 1 else 0.0)
        out[f"{p}.wall_s"] = statistics.mean(c["wall_s"] for c in cells if c["precision"] == p)
    base = precisions[0]
    for p in precisions[1:]:
        for enc in ROWS.values():
            for s in SCORES:
                out[f"{p}-{base}.{enc}.{s}"] = [
                    c[enc][s] - b[enc][s] for c in cells if c["precision"] == p
                    for b in cells if b["precision"] == base and b["seed"] == c["seed"]]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precisions", nargs="+", default=["fp32", "auto"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=RESULTS / "demo_precision.json")
    args = ap.parse_args(argv)
    args.out = args.out.absolute()
    t0 = time.perf_counter()
    cells = [run_cell(p, s) for s in args.seeds for p in args.precisions]  # interleaved: drift hits both
    stats = summary(cells, args.precisions)
    print(f"\n{'precision':<10} {'encoder':<7} " + " ".join(f"{s:>16}" for s in SCORES) + f" {'wall s':>7}")
    for p in args.precisions:
        for enc in ROWS.values():
            cols = " ".join(f"{stats[f'{p}.{enc}.{s}']['mean']:9.2f} ± {stats[f'{p}.{enc}.{s}']['std']:4.2f}"
                            for s in SCORES)
            print(f"{p:<10} {enc:<7} {cols} {stats[f'{p}.wall_s']:7.0f}")
    report = dict(benchmark="demo_precision", what="ropim demo (2 Ray workers pretraining, kNN, probe, fine-tunes)",
                  **provenance("bench/demo_precision.py", argv, t0), cpu=cpu_features(), cpus=os.cpu_count(),
                  cells=cells, summary=stats)
    write_json(report, args.out)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
