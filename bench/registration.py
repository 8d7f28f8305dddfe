"""How long registering a model takes and what it stores: a ViT-B/16 UperNet segmenter (768 channels, 150 classes,
512² crops: the ADE20K preset's shape) and the ViT-B/16 encoder under it, random weights, each registered through
ropim's own function (``register_segmenter``, ``register_encoder``) into a scratch sqlite store.

Per model: wall seconds of the registration call, bytes stored in the artifact store (weights, config, model code,
MLflow metadata) and how many of them are input-example JSON, and the process's peak RSS before and after.

    .venv/bin/python bench/registration.py                       # bench/results/registration.json
    PYTHONPATH=OTHER_CHECKOUT .venv/bin/python bench/registration.py --out bench/results/registration_before.json

The second form measures another checkout's ropim (the code the ``ropim`` column names) with this script.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from record import provenance, write_json  # bench/, beside this file

import ropim
from ropim.core.backbone import create_encoder, encoder_spec
from ropim.core.segmenter import segmenter_from_encoder
from ropim.tracking import registry, store
from ropim.tracking.segmenters import register_segmenter

RESULTS = Path(__file__).resolve().parent / "results"
EXAMPLES = ("input_example.json", "serving_input_example.json")


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stored(root: Path) -> dict:
    """Bytes under ``root`` (an artifact store): all, and those of MLflow's input-example files."""
    files = [p for p in root.rglob("*") if p.is_file()]
    return {"artifact_bytes": sum(p.stat().st_size for p in files),
            "example_bytes": sum(p.stat().st_size for p in files if p.name in EXAMPLES)}


def measure(label: str, register, work: Path) -> dict:
    """Register one model with ``register(run_id, uri)`` in a fresh store under ``work``; time, bytes, peak RSS."""
    work.mkdir()
    uri = f"sqlite:///{work / 'mlflow.db'}"
    run_id = store.create_run("bench-registration", label, {}, uri=uri)
    rss0, t0 = peak_rss_mb(), time.perf_counter()
    model_uri = register(run_id, uri)
    seconds = time.perf_counter() - t0
    store.end_run(run_id, uri=uri)
    row = {"model": label, "uri": model_uri, "seconds": round(seconds, 2), **stored(work / "mlartifacts"),
           "peak_rss_mb_before": round(rss0), "peak_rss_mb_after": round(peak_rss_mb())}
    print(f"{label:<40} {row['seconds']:>8.2f} s  {row['artifact_bytes'] / 1e6:>8.1f} MB stored "
          f"({row['example_bytes'] / 1e6:.1f} MB input examples)  peak RSS {row['peak_rss_mb_before']} → "
          f"{row['peak_rss_mb_after']} MB", flush=True)
    return row


def ropim_commit() -> str:
    """The commit (and whether it has local changes) of the checkout that ``ropim`` was imported from."""
    root = Path(ropim.__file__).resolve().parents[1]
    git = ["git", "-C", str(root)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "ropim"], capture_output=True, text=True).stdout.strip()
    return f"{head}{' + local changes' if dirty else ''}"  # the commit, not this machine's folder


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--crop-size", type=int, default=512)
    p.add_argument("--classes", type=int, default=150)
    p.add_argument("--channels", type=int, default=768)
    p.add_argument("--out", type=Path, default=RESULTS / "registration.json")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    name, kwargs = encoder_spec("beit", "vit_base_patch16_224", img_size=224, patch_size=16)
    seg = segmenter_from_encoder(name, kwargs, None, args.classes, args.crop_size, channels=args.channels)
    encoder = create_encoder(name, kwargs)
    seg_config = {**seg.config, "classes": [f"c{i}" for i in range(args.classes)], "img_size": args.crop_size,
                  "dataset": "bench"}
    enc_config = {"arch": name, "timm_kwargs": kwargs, "img_size": 224, "patch_size": 16, "embed_dim": 768}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(measure(f"segmenter ViT-B/16 UperNet {args.channels}ch {args.crop_size}²",
                            lambda run, uri: register_segmenter(run, seg.model.state_dict(), seg_config, uri=uri),
                            Path(tmp) / "segmenter"))
        rows.append(measure("encoder ViT-B/16 224²",
                            lambda run, uri: registry.register_encoder(run, encoder.state_dict(), enc_config, uri=uri),
                            Path(tmp) / "encoder"))
    write_json({"rows": rows, "ropim": ropim_commit(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                **provenance("bench/registration.py", argv, t0)}, args.out)


if __name__ == "__main__":
    main()
