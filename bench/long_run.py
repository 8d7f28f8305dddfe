"""A long pretraining rehearsed at small cost: many epochs of one or two steps, with evaluations, pictures and
checkpoints due often, so that what grows with the epoch count shows within minutes. It runs ``ropim pretrain`` as a
user would (a scratch folder, relative paths), optionally stops it with a signal at one epoch and continues it with
``--resume NAME``, and measures at sampled epochs:

- the driver's and each Ray Train worker's resident memory, open file descriptors and threads; the processes under
  the driver (Ray's included) and whether workers were replaced;
- epoch wall time (between epoch lines: training, evaluation, records, checkpoint) and its drift, first vs last tenth;
- the MLflow store (``mlflow.db``, ``mlartifacts/``), the run's checkpoint folders (count, size) and other files,
  the loop's temporary checkpoint folders left in the temp folder, Ray's session logs;
- background evaluations submitted and not yet reported (from the job's lines, "epoch E evaluated beside training":
  one in flight, plus one finished and reported at the next epoch's end, is the steady state);
- log lines per epoch, and the lines that are not epoch lines;
- afterwards, from MLflow: every metric's history (points, distinct epochs, epochs recorded twice) and the artifacts.

    PYTHONPATH=. python bench/long_run.py --num-workers 0 --epochs 300 --stop-at 150
    PYTHONPATH=. python bench/long_run.py --num-workers 2 --cpus-per-worker 1 --epochs 300 --stop-at 150
    PYTHONPATH=. python bench/long_run.py --preset vit_tiny_in100 --data s3://bucket/in100 --use-gpu ...

Table on stdout; JSON in ``bench/results/long_run_<mode>.json`` (``--out``). Arguments after ``--`` go to
``ropim pretrain`` as they are. On Ray Train an epoch takes at least Ray's controller poll (about 2 s,
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``: a worker's report waits until the previous one is consumed), so 1-step epochs
there measure Ray, not the loop; give ``--checkpoint-every`` 5 or more (each committed checkpoint waits for a poll too).
Wall times on a shared machine vary with its load: CPU seconds per epoch (driver + Train workers) drift less.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from record import provenance, write_json  # bench/, beside this file

RESULTS = Path(__file__).resolve().parent / "results"
EPOCH_LINE = re.compile(r"^\[pretrain\] epoch (\d+)/(\d+) .* ([\d.]+) s ETA")
LATE_EVAL = re.compile(r"^\[pretrain\] epoch (\d+) evaluated beside training")
MiB = 2**20


def folder_size(path: Path) -> int:
    """Bytes of the files under ``path`` (0 when missing)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with_path = Path(root, f)
            if not with_path.is_symlink():
                total += with_path.stat().st_size if with_path.exists() else 0
    return total


def process_kind(p: psutil.Process) -> str:
    """What a process under the driver is: a Ray Train worker, Train's controller, another Ray worker, Ray's own."""
    try:
        text = " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        return "gone"
    if "RayTrainWorker" in text:
        return "train_worker"
    if "TrainController" in text:
        return "controller"
    if text.startswith("ray::") or "default_worker.py" in text:
        return "ray_worker"
    return "ray_system" if any(s in text for s in ("raylet", "gcs_server", "dashboard", "ray/", "log_monitor")) \
        else "other"


def usage(p: psutil.Process) -> dict | None:
    """RSS (MiB), open fds and threads of ``p``; None when it has exited."""
    try:
        with p.oneshot():
            cpu = p.cpu_times()
            return {"pid": p.pid, "rss_mb": p.memory_info().rss / MiB, "fds": p.num_fds(), "threads": p.num_threads(),
                    "cpu_s": cpu.user + cpu.system}
    except psutil.Error:
        return None


def checkpoints(run: Path) -> list[Path]:
    """The run's checkpoint folders: Ray Train's in the run folder, the in-process loop's in ``in_process/``."""
    return sorted(p for d in (run, run / "in_process") if d.is_dir() for p in d.glob("checkpoint_*") if p.is_dir())


class Monitor:
    """Reads a job's merged output line by line and samples the machine at epoch lines."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir = args, workdir
        self.run_dir = workdir / "ray_results" / args.run_name
        self.samples: list[dict] = []
        self.epochs: dict[int, dict] = {}  # epoch -> {"t": wall clock at its line, "train_s": the line's seconds}
        self.collected: dict[int, int] = {}  # evaluated epoch -> epoch whose end collected it
        self.lines: list[dict] = []  # {"job": i, "text": line}
        self.worker_pids: set[int] = set()
        self.signalled = self.exited = None  # when the stop signal was sent, when the stopped job exited
        self.tmp_before = self.temp_checkpoints()

    def temp_checkpoints(self) -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("ropim-checkpoint-*")}

    def pending(self, epoch: int, job: int) -> int:
        """Background evaluations this job submitted by ``epoch`` and had not collected by then (the epochs it showed
        inline, the run's last among them, excluded)."""
        every = self.args.eval_every
        if not every:
            return 0
        due = [e for e in range(every, epoch + 1, every) if e in self.epochs and self.epochs[e]["job"] == job
               and not self.epochs[e]["inline_eval"]]
        return sum(1 for e in due if self.collected.get(e, 10**9) > epoch)

    def sample(self, driver: psutil.Process, epoch: int, job: int) -> None:
        tree = [(process_kind(p), p) for p in driver.children(recursive=True)]
        workers = [u for k, p in tree if k == "train_worker" and (u := usage(p))]
        self.worker_pids |= {w["pid"] for w in workers}
        kinds: dict[str, int] = {}
        for k, _ in tree:
            kinds[k] = kinds.get(k, 0) + 1
        ckpts = checkpoints(self.run_dir)
        rss = [u["rss_mb"] for p in [driver, *(p for _, p in tree)] if (u := usage(p))]
        ray_logs = Path(tempfile.gettempdir(), "ray", "session_latest", "logs")
        self.samples.append({
            "epoch": epoch, "job": job, "t": time.perf_counter(), "driver": usage(driver), "workers": workers,
            "children": len(tree), "kinds": kinds,
            "tree_rss_mb": sum(rss),
            "mlflow_db_mb": folder_size(self.workdir / "mlflow.db") / MiB,
            "mlartifacts_mb": folder_size(self.workdir / "mlartifacts") / MiB,
            "checkpoints": len(ckpts), "checkpoints_mb": sum(folder_size(c) for c in ckpts) / MiB,
            "run_other_mb": (folder_size(self.run_dir) - sum(folder_size(c) for c in ckpts)) / MiB,
            "temp_checkpoints": len(self.temp_checkpoints() - self.tmp_before),
            "ray_logs_mb": folder_size(ray_logs) / MiB if self.args.num_workers else 0.0,
            "pending_evals": self.pending(epoch, job),
        })

    def read(self, proc: subprocess.Popen, job: int, stop_at: int | None) -> None:
        """Follow ``proc``'s output to its end; sample at the epochs due; send the stop signal at ``stop_at``."""
        driver = psutil.Process(proc.pid)
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            print(line, flush=True) if self.args.verbose else None
            self.lines.append({"job": job, "text": line})
            if m := LATE_EVAL.match(line):
                self.collected[int(m[1])] = max(self.epochs, default=0)
            if not (m := EPOCH_LINE.match(line)):
                continue
            epoch = int(m[1])
            self.epochs[epoch] = {"t": time.perf_counter(), "train_s": float(m[3]), "job": job,
                                  "inline_eval": "knn_top1" in line}
            if epoch == 1 or epoch % self.args.sample_every == 0 or epoch == self.args.epochs or epoch == stop_at:
                self.sample(driver, epoch, job)
            if epoch == stop_at:
                threading.Timer(self.args.stop_delay, self.stop, (proc,)).start()
        proc.wait()
        self.exited = time.perf_counter()

    def stop(self, proc: subprocess.Popen) -> None:
        """Send the stop signal to the job's driver; remember when (its exit says how long the stop took)."""
        self.signalled = time.perf_counter()
        proc.send_signal(self.args.signal)


def pretrain_command(args: argparse.Namespace, resume: bool) -> list[str]:
    """The ``ropim pretrain`` command line of the first job, or of the job that continues it."""
    ropim = shutil.which("ropim", path=str(Path(sys.executable).parent)) or "ropim"
    if resume:
        return [ropim, "pretrain", "--resume", args.run_name]
    cmd = [ropim, "pretrain", "--preset", args.preset, "--num_workers", str(args.num_workers),
           "--epochs", str(args.epochs), "--max_steps_per_epoch", str(args.steps), "--eval_every", str(args.eval_every),
           "--viz_every", str(args.viz_every), "--checkpoint_every", str(args.checkpoint_every),
           "--keep_checkpoints", str(args.keep), "--log_every", str(args.log_every), "--run_name", args.run_name]
    if args.data:
        cmd += ["--data.source", args.data]
    if args.cpus_per_worker:
        cmd += ["--cpus_per_worker", str(args.cpus_per_worker)]
    return cmd + args.extra


def run_jobs(args: argparse.Namespace, workdir: Path) -> tuple[Monitor, list[dict]]:
    """The first job (stopped at ``--stop-at`` when given), then the continuing one; their commands and exits."""
    monitor, jobs = Monitor(args, workdir), []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for job, resume in enumerate([False, True] if args.stop_at else [False]):
        cmd = pretrain_command(args, resume)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        monitor.read(proc, job, args.stop_at if not resume else None)
        jobs.append({"command": " ".join(["ropim", *cmd[1:]]), "exit": proc.returncode,
                     "wall_s": time.perf_counter() - t0})
        if not resume and monitor.signalled is not None:
            jobs[-1]["stop_to_exit_s"] = monitor.exited - monitor.signalled
        print(f"job {job}: exit {proc.returncode} after {jobs[-1]['wall_s']:.0f} s: {jobs[-1]['command']}", flush=True)
    return monitor, jobs


def mlflow_summary(workdir: Path, run_name: str) -> dict:
    """The run's metric histories (points, epochs, epochs recorded twice) and artifacts, read from its store."""
    from mlflow.tracking import MlflowClient

    uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(workdir / 'mlflow.db').resolve()}"
    c = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(experiments, filter_string=f"attributes.run_name = '{run_name}'")
    if not runs:
        return {"error": f"no run named {run_name} in {uri}"}
    run = runs[0]
    metrics = {}
    for key in sorted(run.data.metrics):
        steps = [m.step for m in c.get_metric_history(run.info.run_id, key)]
        metrics[key] = {"points": len(steps), "epochs": len(set(steps)), "twice": len(steps) - len(set(steps))}
    todo, artifacts = [""], []
    while todo:
        for f in c.list_artifacts(run.info.run_id, todo.pop() or None):
            (todo.append(f.path) if f.is_dir else artifacts.append({"path": f.path, "bytes": f.file_size or 0}))
    return {"run_id": run.info.run_id, "status": run.info.status, "metrics": metrics, "artifacts": artifacts}


def drift(monitor: Monitor) -> dict:
    """Epoch wall times (between consecutive epoch lines of one job) and their first-tenth vs last-tenth medians."""
    walls = {}
    ordered = sorted(monitor.epochs.items())
    for (e0, a), (e1, b) in zip(ordered, ordered[1:], strict=False):
        if e1 == e0 + 1 and a["job"] == b["job"]:
            walls[e1] = b["t"] - a["t"]
    values = [walls[e] for e in sorted(walls) if e > 2]  # the first epochs warm up
    tenth = max(1, len(values) // 10)
    first, last = statistics.median(values[:tenth]), statistics.median(values[-tenth:])
    train = [v["train_s"] for _, v in ordered]
    cpu = [v for _, v in sorted(cpu_per_epoch(monitor.samples).items())]
    ctenth = max(1, len(cpu) // 10)
    return {"cpu_s_per_epoch_first_tenth": statistics.median(cpu[:ctenth]) if cpu else None,
            "cpu_s_per_epoch_last_tenth": statistics.median(cpu[-ctenth:]) if cpu else None,
            "wall_s": walls, "first_tenth_median_s": first, "last_tenth_median_s": last, "ratio": last / first,
            "train_first_tenth_median_s": statistics.median(train[:tenth]),
            "train_last_tenth_median_s": statistics.median(train[-tenth:])}


def cpu_per_epoch(samples: list[dict]) -> dict[int, float]:
    """CPU seconds (user + system) the driver and the Ray Train workers spent per epoch since the sample before, at
    each sample: a drift measure that other work on a shared machine disturbs less than wall time."""
    out = {}
    for a, b in zip(samples, samples[1:], strict=False):
        if a["job"] != b["job"] or b["epoch"] <= a["epoch"]:
            continue
        before = {u["pid"]: u["cpu_s"] for u in [a["driver"], *a["workers"]] if u}
        spent = sum(u["cpu_s"] - before[u["pid"]] for u in [b["driver"], *b["workers"]] if u and u["pid"] in before)
        out[b["epoch"]] = spent / (b["epoch"] - a["epoch"])
    return out


def line_summary(monitor: Monitor, jobs: list[dict]) -> dict:
    """Lines per job, epoch lines among them, and the other lines with digits folded (how often each)."""
    out = []
    for job in range(len(jobs)):
        lines = [x["text"] for x in monitor.lines if x["job"] == job]
        epochs = sum(1 for t in lines if EPOCH_LINE.match(t))
        others: dict[str, int] = {}
        for t in lines:
            if not EPOCH_LINE.match(t):
                key = re.sub(r"\d+(\.\d+)?", "N", t)[:200]
                others[key] = others.get(key, 0) + 1
        out.append({"lines": len(lines), "bytes": sum(len(t) + 1 for t in lines), "epoch_lines": epochs,
                    "other_lines": others})
    return {"jobs": out}


SERIES = {  # name -> how to read it from a sample
    "driver_rss_mb": lambda s: (s["driver"] or {}).get("rss_mb"),
    "driver_fds": lambda s: (s["driver"] or {}).get("fds"),
    "driver_threads": lambda s: (s["driver"] or {}).get("threads"),
    "worker_rss_mb": lambda s: max((w["rss_mb"] for w in s["workers"]), default=None),
    "worker_fds": lambda s: max((w["fds"] for w in s["workers"]), default=None),
    "worker_threads": lambda s: max((w["threads"] for w in s["workers"]), default=None),
    "children": lambda s: s["children"],
    "tree_rss_mb": lambda s: s["tree_rss_mb"],
    "mlflow_db_mb": lambda s: s["mlflow_db_mb"],
    "mlartifacts_mb": lambda s: s["mlartifacts_mb"],
    "checkpoints": lambda s: s["checkpoints"],
    "checkpoints_mb": lambda s: s["checkpoints_mb"],
    "run_other_mb": lambda s: s["run_other_mb"],
    "temp_checkpoints": lambda s: s["temp_checkpoints"],
    "ray_logs_mb": lambda s: s["ray_logs_mb"],
    "pending_evals": lambda s: s["pending_evals"],
}


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares growth per 100 epochs of (epoch, value) points."""
    if len(points) < 2:
        return 0.0
    mx, my = statistics.fmean(e for e, _ in points), statistics.fmean(v for _, v in points)
    var = sum((e - mx) ** 2 for e, _ in points)
    return 100 * sum((e - mx) * (v - my) for e, v in points) / var if var else 0.0


def growth(samples: list[dict], warmup: int) -> dict:
    """Per job and series: the value at the first sample after ``warmup`` epochs, at the last, the largest, and the
    fitted growth per 100 epochs."""
    out = {}
    for job in sorted({s["job"] for s in samples}):
        mine = [s for s in samples if s["job"] == job]
        start = min((s["epoch"] for s in mine), default=0) + warmup
        out[job] = {}
        for name, read in SERIES.items():
            pts = [(s["epoch"], v) for s in mine if s["epoch"] >= start and (v := read(s)) is not None]
            if pts:
                out[job][name] = {"first": pts[0][1], "last": pts[-1][1], "max": max(v for _, v in pts),
                                  "per_100_epochs": slope(pts)}
    return out


def table(samples: list[dict], walls: dict[int, float], every: int) -> str:
    """The samples as a text table; ``wall s`` is the median epoch wall time over the ``every`` epochs before."""
    head = (f"{'epoch':>5} {'job':>3} {'drv MiB':>8} {'fds':>4} {'thr':>4} {'wrk MiB':>8} {'wfds':>5} {'wthr':>5} "
            f"{'procs':>5} {'wall s':>7} {'db MiB':>7} {'art MiB':>8} {'ckpt':>4} {'ckpt MiB':>8} "
            f"{'evals q':>7} {'tmp':>4} {'cpu s/ep':>8}")
    rows, cpu = [head], cpu_per_epoch(samples)
    for s in samples:
        d = s["driver"] or {}
        w = {k: SERIES[f"worker_{k}"](s) for k in ("rss_mb", "fds", "threads")}
        near = [walls[e] for e in range(s["epoch"] - every + 1, s["epoch"] + 1) if e in walls]
        wall = f"{statistics.median(near):7.2f}" if near else f"{'-':>7}"
        wv = [f"{v:{n}.0f}" if v is not None else f"{'-':>{n}}" for v, n in
              ((w["rss_mb"], 8), (w["fds"], 5), (w["threads"], 5))]
        rows.append(f"{s['epoch']:>5} {s['job']:>3} {d.get('rss_mb', 0):8.0f} {d.get('fds', 0):4d} "
                    f"{d.get('threads', 0):4d} {' '.join(wv)} {s['children']:5d} {wall} {s['mlflow_db_mb']:7.2f} "
                    f"{s['mlartifacts_mb']:8.2f} {s['checkpoints']:4d} {s['checkpoints_mb']:8.1f} "
                    f"{s['pending_evals']:7d} {s['temp_checkpoints']:4d} "
                    + (f"{cpu[s['epoch']]:8.2f}" if s["epoch"] in cpu else f"{'-':>8}"))
    return "\n".join(rows)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", default="digits_demo", help="ropim pretrain --preset")
    p.add_argument("--data", default=None, help="--data.source (default: the preset's)")
    p.add_argument("--num-workers", type=int, default=0, help="0: in this process; N: Ray Train workers")
    p.add_argument("--cpus-per-worker", type=float, default=None)
    p.add_argument("--epochs", type=int, default=300)
    p.add_argument("--steps", type=int, default=1, help="--max_steps_per_epoch")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--viz-every", type=int, default=10)
    p.add_argument("--checkpoint-every", type=int, default=1)
    p.add_argument("--keep", type=int, default=3, help="--keep_checkpoints")
    p.add_argument("--log-every", type=int, default=1000, help="steps between progress lines")
    p.add_argument("--stop-at", type=int, default=0, help="stop the job at this epoch's line, then --resume (0: no)")
    p.add_argument("--stop-delay", type=float, default=0.5, help="seconds after that line")
    p.add_argument("--signal", type=lambda s: signal.Signals[f"SIG{s.upper().removeprefix('SIG')}"],
                   default=signal.SIGTERM, help="TERM or INT, to the driver")
    p.add_argument("--sample-every", type=int, default=10, help="epochs between samples")
    p.add_argument("--run-name", default="long")
    p.add_argument("--workdir", type=Path, default=None, help="a scratch folder (default: a new temporary one)")
    p.add_argument("--keep-workdir", action="store_true")
    p.add_argument("--out", type=Path, default=None, help="default: bench/results/long_run_<mode>.json")
    p.add_argument("--verbose", action="store_true", help="echo the job's lines")
    p.add_argument("extra", nargs="*", help="after --: more ropim pretrain flags")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args, t0 = parse(argv), time.perf_counter()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ropim-long-run-"))
    workdir.mkdir(parents=True, exist_ok=True)
    monitor, jobs = run_jobs(args, workdir)
    d = drift(monitor)
    report = {
        "setup": {k: (str(v) if isinstance(v, Path | signal.Signals) else v) for k, v in vars(args).items()},
        "jobs": jobs, "epochs_seen": len(monitor.epochs), "last_epoch": max(monitor.epochs, default=0),
        "train_worker_pids": sorted(monitor.worker_pids), "growth": growth(monitor.samples, args.sample_every),
        "epoch_time": {k: v for k, v in d.items() if k != "wall_s"}, "epoch_wall_s": d["wall_s"],
        "samples": monitor.samples, "lines": line_summary(monitor, jobs),
        "late_evaluations": monitor.collected, "mlflow": mlflow_summary(workdir, args.run_name),
        "cpu": {"count": os.cpu_count()}, **provenance("bench/long_run.py", argv, t0),
    }
    print(table(monitor.samples, d["wall_s"], args.sample_every))
    summarize(report)
    mode = "inprocess" if args.num_workers == 0 else f"ray{args.num_workers}"
    out = args.out or RESULTS / f"long_run_{mode}.json"
    write_json(report, out)
    print(f"JSON: {out}; scratch folder: {workdir}")
    if args.workdir is None and not args.keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def summarize(report: dict) -> None:
    """The lines a reader checks first: growth per 100 epochs, epoch time drift, records, checkpoints, lines."""
    for job, series in report["growth"].items():
        grown = ", ".join(f"{k} {v['first']:.4g}->{v['last']:.4g} ({v['per_100_epochs']:+.3g}/100 ep)"
                          for k, v in series.items())
        print(f"job {job}: {grown}")
    t = report["epoch_time"]
    print(f"epoch wall time: first tenth {t['first_tenth_median_s']:.3f} s, last tenth "
          f"{t['last_tenth_median_s']:.3f} s (x{t['ratio']:.2f}); "
          f"training part {t['train_first_tenth_median_s']:.2f} -> {t['train_last_tenth_median_s']:.2f} s; CPU s per "
          f"epoch (driver + workers) {t['cpu_s_per_epoch_first_tenth']} -> {t['cpu_s_per_epoch_last_tenth']}")
    m = report["mlflow"]
    if "metrics" in m:
        twice = {k: v["twice"] for k, v in m["metrics"].items() if v["twice"]}
        print(f"MLflow run {m['run_id']} {m['status']}: {len(m['metrics'])} metrics, epoch_time_s at "
              f"{m['metrics'].get('epoch_time_s', {}).get('epochs')} epochs, recorded twice: {twice or 'none'}; "
              f"{len(m['artifacts'])} artifacts ({sum(a['bytes'] for a in m['artifacts']) / MiB:.1f} MiB)")
    for job, lines in enumerate(report["lines"]["jobs"]):
        print(f"job {job} lines: {lines['lines']} ({lines['epoch_lines']} epoch lines, {lines['bytes']} bytes); "
              f"others: {sum(lines['other_lines'].values())}")


if __name__ == "__main__":
    main()
