"""Segmentation quality on the built-in digits canvases through the service itself: UperNet from a ROPIM-pretrained
encoder vs from a randomly initialised encoder of the same architecture, at the same recipe and budget (the
``digits_seg`` preset), over several seeds (mean ± std of val mIoU and pixel accuracy).

The pretrained encoder is ``--encoder`` (a ``models:/`` URI of your MLflow store, e.g. what ``make demo``
registers, or a local encoder folder), or, by default, one pretrained here with the ``digits_demo`` pretraining
preset (``ropim.train.driver.run``, in this process). Every segmentation is the code of ``ropim segment``
(``ropim.train.driver.run``, ``num_workers=0``) in a scratch MLflow store; nothing is registered.

    .venv/bin/python bench/segment_quality.py --seeds 0 1                         # pretrains, then 4 segmentations
    .venv/bin/python bench/segment_quality.py --encoder models:/ropim-encoder/1   # the demo's encoder
    .venv/bin/python bench/segment_quality.py --tiny                              # the whole path in minutes

Output: a Markdown table on stdout and ``bench/results/segment_quality.json`` (``--out``), with the command and
wall times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from safetensors.torch import save_file

from ropim.tracking.registry import load_encoder_files
from ropim.train.driver import run
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig

PRESETS = Path(__file__).resolve().parents[1] / "ropim" / "presets"
RESULTS = Path(__file__).resolve().parent / "results"
TINY = dict(pretrain_epochs=1, pretrain_steps=2, epochs=1, steps=2, canvases=40)


def preset(command: str, name: str) -> dict:
    """A shipped preset as a dict."""
    return yaml.safe_load((PRESETS / command / f"{name}.yaml").read_text())


def local_encoder(uri: str, folder: Path) -> str:
    """The encoder at ``uri`` (read from the caller's MLflow store) copied to ``folder``: the bench's scratch store
    then serves every job."""
    state, config = load_encoder_files(uri)
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "encoder.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def pretrained_here(args) -> tuple[str, dict]:
    """Pretrain with the digits_demo preset in this process; (encoder folder, what was run)."""
    d = preset("pretrain", "digits_demo") | {"num_workers": 0, "epochs": args.pretrain_epochs, "viz_every": 0,
                                             "max_steps_per_epoch": args.pretrain_steps, "run_name": "bench-pretrain"}
    result = run(PretrainConfig.from_dict(d))
    return local_encoder(result.model_uri, Path("encoder")), {"pretrain_epochs": args.pretrain_epochs,
                                                               "pretrain_steps_per_epoch": args.pretrain_steps}


def segment_config(args, encoder: str, seed: int, random_init: bool) -> SegmentConfig:
    """The digits_seg preset with the bench's budget; one seed; nothing registered, no picture."""
    d = preset("segment", "digits_seg")
    cfg = SegmentConfig.from_dict({**d, "data": {**d.get("data", {}), "canvases": args.canvases}})
    return dataclasses.replace(cfg, encoder=encoder, seed=seed, random_init=random_init, epochs=args.epochs,
                               max_steps_per_epoch=args.steps, registered_model="", viz_images=0, num_workers=0,
                               run_name=f"bench-{'random' if random_init else 'pretrained'}-{seed}",
                               data=dataclasses.replace(cfg.data, canvases=args.canvases))


def table(rows: list[dict]) -> str:
    """Mean ± std over seeds per encoder."""
    lines = ["| encoder | seeds | mIoU (%) | pixel accuracy (%) | minutes per run |", "|---|---|---|---|---|"]
    for init in ("pretrained", "random init"):
        rs = [r for r in rows if r["encoder"] == init]
        cells = []
        for k in ("miou", "pixel_acc"):
            v = [r[k] for r in rs]
            cells.append(f"{statistics.fmean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}")
        minutes = statistics.fmean(r["seconds"] for r in rs) / 60
        lines.append(f"| {init} | {len(rs)} | {cells[0]} | {cells[1]} | {minutes:.1f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--encoder", default=None, help="models:/… URI or encoder folder (default: pretrain one here)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--pretrain-epochs", type=int, default=preset("pretrain", "digits_demo")["epochs"])
    p.add_argument("--pretrain-steps", type=int, default=None, help="cap on pretraining steps per epoch")
    p.add_argument("--epochs", type=int, default=preset("segment", "digits_seg")["epochs"], help="segmentation epochs")
    p.add_argument("--steps", type=int, default=None, help="cap on segmentation steps per epoch")
    p.add_argument("--canvases", type=int, default=preset("segment", "digits_seg")["data"]["canvases"],
                   help="digits canvases (train + val)")
    p.add_argument("--tiny", action="store_true", help=f"the whole path, small: {TINY}")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON path (default bench/results/segment_quality[_tiny].json)")
    args = p.parse_args(argv)
    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    t0 = time.perf_counter()
    rows, source = [], {"encoder": args.encoder or "pretrained here (digits_demo preset)"}
    with tempfile.TemporaryDirectory() as tmp:
        encoder = local_encoder(args.encoder, Path(tmp) / "encoder") if args.encoder and \
            args.encoder.startswith(("models:/", "runs:/")) else args.encoder and os.path.abspath(args.encoder)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        os.chdir(tmp)  # checkpoints and MLflow artifacts of the bench stay in the scratch folder
        if encoder is None:
            encoder, done = pretrained_here(args)
            source |= done | {"pretrain_s": round(time.perf_counter() - t0, 1)}
        for seed in args.seeds:
            for random_init in (False, True):
                t1 = time.perf_counter()
                res = run(segment_config(args, encoder, seed, random_init)).metrics
                rows.append({"encoder": "random init" if random_init else "pretrained", "seed": seed,
                             "miou": res["miou"], "pixel_acc": res["pixel_acc"], "train_loss": res["train_loss"],
                             "seconds": round(time.perf_counter() - t1, 1)})
                print(f"[segment_quality] {rows[-1]}", flush=True)
    md = table(rows)
    out = args.out or RESULTS / ("segment_quality_tiny.json" if args.tiny else "segment_quality.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "bench/segment_quality.py", *sys.argv[1:]])  # no path of this machine
    result = {"command": command, "wall_s": round(time.perf_counter() - t0, 1),
              "args": {k: str(v) for k, v in vars(args).items() if k not in ("out", "encoder")}, "source": source,
              "recipe": "ropim/presets/segment/digits_seg.yaml", "rows": rows, "table": md}
    if args.encoder and not args.encoder.startswith(("models:/", "runs:/")):
        result["source"]["encoder"] = "a local encoder folder"  # no path of this machine in the JSON
    out.write_text(json.dumps(result, indent=2))
    print(f"\n{md}\n\nwall time {result['wall_s'] / 60:.1f} min; {out}")
    return result


if __name__ == "__main__":
    main()
