"""A tracking server that goes down while a run trains, rehearsed with a real ``mlflow server``: it runs
``ropim pretrain`` against the server from a scratch folder, stops the server (SIGTERM) when epoch ``--down-at`` ends,
starts it again on the same port and store when epoch ``--up-at`` ends, and measures:

- whether the job finished and registered its encoder, and its exit status;
- every epoch's ``loss`` in MLflow afterwards (epochs missing, epochs recorded twice);
- the job's lines about the store (the one when it stopped taking records, the one when it took them again), and
  any traceback it printed;
- the wall time between epoch lines while the server was down against the others (each record then waits out
  MLflow's own retries: ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` and ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``, given
  here small so that the rehearsal takes a minute; MLflow's defaults wait about 4 minutes per call).

    PYTHONPATH=. python bench/store_outage.py --epochs 10 --down-at 2 --up-at 6
    PYTHONPATH=. python bench/store_outage.py --epochs 4 --down-at 3 --up-at 0   # down to the job's end
    PYTHONPATH=. python bench/store_outage.py --down-after 2 -- --max_steps_per_epoch 10  # down while epoch 3 trains

With ``--up-at 0`` the server stays down to the job's end; it is then started again and the job's ``--resume``
command run, as its last line says: what the first job ended with, and whether the second recorded and registered.
Table on stdout; JSON in ``bench/results/store_outage.json`` (``--out``). Arguments after ``--`` go to
``ropim pretrain`` as they are.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from record import provenance, write_json  # bench/, beside this file

RESULTS = Path(__file__).resolve().parent / "results"
EPOCH_LINE = re.compile(r"^\[pretrain\] epoch (\d+)/(\d+) ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(folder: Path, port: int) -> subprocess.Popen:
    """``mlflow server`` on 127.0.0.1:``port`` over the sqlite store and artifacts in ``folder``, once it answers."""
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
                             "--artifacts-destination", str(folder / "mlartifacts"), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("mlflow server did not start in 120 s")


def stamped(stream: Iterable[str]) -> Iterator[tuple[float, str]]:
    """``stream``'s lines with the time each was read, read on a thread of their own: the epoch gaps stay true while
    the caller waits (``--down-after``) or stops and starts the server."""
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put((time.time(), line))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return iter(lines.get, None)


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)


def rehearse(args: argparse.Namespace, extra: list[str]) -> dict:
    """Run the job against a server stopped and started again at the epochs asked; what it measured."""
    scratch = Path(tempfile.mkdtemp(prefix="ropim-outage-"))
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(args.retries),
           "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "PYTHONUNBUFFERED": "1"}
    mlflow_proc = server(scratch, port)
    cmd = [sys.executable, "-m", "ropim.cli", "pretrain", "--preset", "digits_demo", "--epochs", str(args.epochs),
           "--num_workers", str(args.num_workers), "--max_steps_per_epoch", "2", "--viz_every", "1",
           "--run_name", "outage", "--registered_model", "outage-encoder", *extra]
    job = subprocess.Popen(cmd, cwd=scratch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, seen, t_down = [], {}, None
    for t, line in stamped(job.stdout):
        lines.append(line.rstrip())
        m = EPOCH_LINE.match(line.strip())
        if not m:
            continue
        epoch = int(m.group(1))
        seen[epoch] = t
        if mlflow_proc is not None and epoch == args.down_at:
            time.sleep(args.down_after)  # 0: while epoch down_at's pictures and records are sent (a race with them)
            stop(mlflow_proc)
            mlflow_proc, t_down = None, time.time()
        elif mlflow_proc is None and epoch == args.up_at:
            mlflow_proc = server(scratch, port)
            down_s = time.time() - t_down
    status, resumed = job.wait(), None
    if args.log:
        args.log.write_text("\n".join(lines) + "\n")
    if mlflow_proc is None:
        mlflow_proc = server(scratch, port)
        down_s = time.time() - t_down
        again = subprocess.run([*cmd[:cmd.index("--preset")], "--resume", "outage"], cwd=scratch, env=env,
                               capture_output=True, text=True)
        resumed = dict(exit_status=again.returncode, last_line=(again.stdout.strip().splitlines() or [""])[-1])
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id])
    history = [m.step for m in c.get_metric_history(runs[0].info.run_id, "loss")] if runs else []
    versions = c.search_model_versions("name='outage-encoder'")
    stop(mlflow_proc)
    store_lines = [x for x in lines if "tracking store" in x]
    between = {e: round(seen[e] - seen[e - 1], 2) for e in seen if e - 1 in seen}  # epoch e-1's line to e's
    down = range(args.down_at + 1, args.up_at + 1)  # e-1's records (and pictures) met the server down
    up = sorted(s for e, s in between.items() if e not in down)
    return dict(
        epochs=args.epochs, down_at=args.down_at, down_after_s=args.down_after, up_at=args.up_at,
        num_workers=args.num_workers,
        mlflow_retries=args.retries, exit_status=status, server_down_s=round(down_s, 1) if t_down else None,
        run_status=runs[0].info.status if runs else None, registered_versions=len(versions),
        epochs_recorded=sorted(set(history)), epochs_missing=sorted(set(range(1, args.epochs + 1)) - set(history)),
        epochs_recorded_twice=sorted({s for s in history if history.count(s) > 1}),
        s_between_epoch_lines_server_down=[between[e] for e in down if e in between],
        s_between_epoch_lines_server_up_median=up[len(up) // 2] if up else None,
        store_lines=store_lines, tracebacks=sum("Traceback" in x for x in lines), last_lines=lines[-3:],
        resumed=resumed)


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--down-at", type=int, default=2, help="stop the server when this epoch's line is printed")
    p.add_argument("--down-after", type=float, default=0.0,
                   help="seconds after that line: give epochs longer than this (-- --max_steps_per_epoch N) so that "
                        "the server stops while the next epoch trains")
    p.add_argument("--up-at", type=int, default=6, help="start it again when this epoch's line is printed")
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--retries", type=int, default=2, help="MLFLOW_HTTP_REQUEST_MAX_RETRIES for the job")
    p.add_argument("--out", type=Path, default=RESULTS / "store_outage.json")
    p.add_argument("--log", type=Path, default=None, help="write the job's whole output there")
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    report = {**rehearse(args, extra), **provenance("bench/store_outage.py", argv, t0)}
    for k, v in report.items():
        print(f"{k:28} {v}")
    write_json(report, args.out)


if __name__ == "__main__":
    main()
