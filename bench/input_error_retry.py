"""What a bad image under ``data.on_bad_image=fail`` costs a Ray Train job that may restart (``max_failures``): the
job pretrains on a Parquet shard of ``--images`` PNGs, one of them cut short, on 2 Ray Train workers, and fails on
it; measured are the wall time to the failure, the exit status and the job's last line, and how many epoch progress
lines of the run the workers printed (an attempt that trains up to the bad image again prints them again).

    PYTHONPATH=. python bench/input_error_retry.py --images 3000 --max-failures 1

Run it on two versions of ropim side by side to compare them. Table on stdout; JSON in
``bench/results/input_error_retry.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image
from record import provenance, write_json  # bench/, beside this file

RESULTS = Path(__file__).resolve().parent / "results"


def shard(folder: Path, images: int, bad_at: int) -> None:
    """``folder``/train-00000.parquet: ``images`` random 32² PNGs with labels 0-9, the one at ``bad_at`` cut short."""
    rng = np.random.default_rng(0)
    encoded = []
    for i in range(images):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
        encoded.append(buf.getvalue()[:20] if i == bad_at else buf.getvalue())
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"image": encoded, "label": pa.array([i % 10 for i in range(images)], pa.int64()),
                             "path": [f"img{i}.png" for i in range(images)]}), folder / "train-00000.parquet")


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--bad-at", type=float, default=0.9, help="where the bad image sits, as a share of the shard")
    p.add_argument("--max-failures", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS / "input_error_retry.json")
    args = p.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="ropim-bad-input-"))
    shard(scratch / "bytes", args.images, int(args.bad_at * args.images))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{scratch}/mlflow.db", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "ropim.cli", "pretrain", "--preset", "digits_demo", "--data.source", "bytes",
           "--data.on_bad_image", "fail", "--data.val_fraction", "0.01", "--epochs", "1", "--log_every", "5",
           "--num_workers", "2", "--max_failures", str(args.max_failures), "--run_name", "bad-input"]
    start = time.perf_counter()
    job = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = (job.stdout + job.stderr).splitlines()
    progress = [x for x in lines if "[pretrain] epoch 1/1 step" in x]
    report = dict(images=args.images, bad_at=args.bad_at, max_failures=args.max_failures, exit_status=job.returncode,
                  job_wall_s=round(wall, 1), progress_lines=len(progress), last_line=(job.stderr.strip().splitlines()
                                                                                    or [""])[-1][:400],
                  **provenance("bench/input_error_retry.py", argv, t0))
    write_json(report, args.out)
    for key in ("images", "max_failures", "exit_status", "job_wall_s", "progress_lines", "last_line"):
        print(f"{key:<16} {report[key]}")


if __name__ == "__main__":
    main()
