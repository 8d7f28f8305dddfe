"""The demo's pretraining end to end under each CPU setting: the ``digits_demo`` pretrain preset (Ray start, all its
epochs, registration) run by the library (``ropim.train.driver.run``), one setting after another; wall time,
steady img/s (the median epoch) and the registered encoder's kNN / linear-probe top-1 on the digits val split, so
that speed is read beside quality (a setting that changes the numbers shows it here).

A setting is ``2w`` (the preset: 2 Ray Train workers × 1 CPU), ``1w`` (1 Ray Train worker × all CPUs) or ``inproc``
(``num_workers 0``: this process, torch's threads), with ``+fused`` (AdamW's fused kernel), ``+compile``
(torch.compile, inductor), ``+fp32`` and ``+bf16`` (precision instead of the preset's ``auto``) as modifiers.
Table on stdout, JSON in ``bench/results/demo_speed.json``.

    PYTHONPATH=. python bench/demo_speed.py --settings 2w+fp32 2w 1w inproc 2w+fused
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from record import provenance, write_json  # bench/, beside this file

from ropim.data.config import DataConfig
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.speed import cpu_features

RESULTS = Path(__file__).resolve().parent / "results"
PRESET = Path(__file__).resolve().parents[1] / "ropim" / "presets" / "pretrain" / "digits_demo.yaml"


def setting_config(setting: str, epochs: int | None, storage: str) -> PretrainConfig:
    """The preset with ``setting``'s workers and options."""
    base, *mods = setting.split("+")
    cores = os.cpu_count() or 1
    workers = {"2w": (2, 1.0), "1w": (1, float(cores)), "inproc": (0, 1.0)}[base]
    cfg = PretrainConfig.from_dict(yaml.safe_load(PRESET.read_text()))
    return PretrainConfig.from_dict({
        **cfg.to_dict(), "num_workers": workers[0], "cpus_per_worker": workers[1],
        "adamw": "fused" if "fused" in mods else "default", "compile": "compile" in mods,
        "precision": next((m for m in mods if m in ("fp32", "bf16")), cfg.precision),
        "epochs": epochs or cfg.epochs, "storage_path": storage, "run_name": setting.replace("+", "-"),
        "registered_model": "demo-speed-bench"})


def run_setting(setting: str, args: argparse.Namespace, storage: str) -> dict:
    from ropim.tracking import store
    from ropim.tracking.registry import load_encoder
    from ropim.train.downstream import frozen_scores
    from ropim.train.driver import run

    cfg = setting_config(setting, args.epochs, storage)
    t0 = time.perf_counter()
    result = run(cfg)
    wall = time.perf_counter() - t0
    rates = [m.value for m in store.client().get_metric_history(result.run_id, "img_per_s")]
    encoder, enc_cfg = load_encoder(result.model_uri)
    scores = frozen_scores(encoder, enc_cfg["img_size"], DataConfig())
    row = dict(setting=setting, num_workers=cfg.num_workers, cpus_per_worker=cfg.cpus_per_worker, adamw=cfg.adamw,
               compile=cfg.compile, precision=cfg.precision, epochs=cfg.epochs, wall_s=wall,
               img_per_s_median=statistics.median(rates),
               final_loss=result.metrics["loss"], **scores)
    print(f"  {setting}: {wall:.0f} s, {row['img_per_s_median']:.1f} img/s, loss {row['final_loss']:.4f}, kNN "
          f"{scores['knn_top1']:.2f}, linear {scores['linear_top1']:.2f}", flush=True)
    return row


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", nargs="+", default=["2w+fp32", "2w", "1w", "inproc", "2w+fused"])
    ap.add_argument("--epochs", type=int, default=None, help="default: the preset's")
    ap.add_argument("--out", type=Path, default=RESULTS / "demo_speed.json")
    args = ap.parse_args(argv)
    args.out = args.out.absolute()
    t0, rows = time.perf_counter(), []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        for setting in args.settings:
            rows.append(run_setting(setting, args, f"{tmp}/runs"))
    base = rows[0]
    print(f"\n{'setting':<16} {'wall s':>7} {'x ' + base['setting']:>10} {'img/s':>8} {'loss':>8} {'kNN':>7} "
          f"{'linear':>7}")
    for r in rows:
        r["x_first"] = base["wall_s"] / r["wall_s"]
        print(f"{r['setting']:<16} {r['wall_s']:7.0f} {r['x_first']:10.2f} {r['img_per_s_median']:8.1f} "
              f"{r['final_loss']:8.4f} {r['knn_top1']:7.2f} {r['linear_top1']:7.2f}")
    report = dict(benchmark="demo_speed", what="digits_demo pretraining: Ray start -> registered encoder",
                  **provenance("bench/demo_speed.py", argv, t0), cpus=os.cpu_count(), cpu=cpu_features(),
                  rows=rows)
    write_json(report, args.out)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
