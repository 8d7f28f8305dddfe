"""How the cost of a ROPIM training step grows with the work: ms/step, img/s and peak memory against the number of
tokens N (image size / patch size), against the batch, and with 1 vs 2 Ray Train workers, for ``rop``, ``mask`` and
``none``; the share of the ``rop`` step spent drawing and applying Π (forward + backward) at every size; log-log fits
of the growth and a fit of ms/step = a·N + b·N² (per-token work against attention's N²).

One training step = draw the corruption, forward, backward, AdamW step, through the library (``ropim.core.model``).
Corruptions are interleaved round by round (rop, mask, none, rop, …) and medians reported; peak memory is the peak
resident set of a fresh process that runs two steps of that configuration (``--no-memory`` skips it). The workers
table runs the real job (``ropim.train.pretrain`` on the built-in digits, Ray Train, ``cpus_per_worker`` = cores /
workers) and reads its steady epoch rate. Table on stdout; JSON and PNG plot in ``bench/results/``.

    PYTHONPATH=. python bench/scaling.py                       # the full sweep (~15 min on 2 idle cores)
    PYTHONPATH=. python bench/scaling.py --tiny                # every path at toy sizes, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from record import provenance, write_json  # bench/, beside this file
from rop_overhead import time_ops
from timm.optim import create_optimizer_v2

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM
from ropim.train.speed import resolve_precision

RESULTS = Path(__file__).resolve().parent / "results"
CORRUPTIONS = ("rop", "mask", "none")


def model_config(args: argparse.Namespace, img_size: int, corruption: str) -> ModelConfig:
    return ModelConfig(arch=args.arch, backbone=args.backbone, img_size=img_size, patch_size=args.patch_size,
                       depth=args.depth, corruption=corruption)


def train_step_fn(cfg: ModelConfig, batch: int, precision: str = "fp32"):
    """A closure running one training step of a fresh model (same initial weights for every corruption), under
    ``precision``'s autocast (fp32: none)."""
    torch.manual_seed(0)
    model = ROPIM(cfg).train()
    opt = create_optimizer_v2(model, "adamw", lr=1e-4, weight_decay=0.05, betas=(0.9, 0.95))
    imgs = torch.randn(batch, 3, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(1)

    def step() -> None:
        corruption = model.draw_corruption(batch, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(imgs, corruption=corruption)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def time_interleaved(steps: dict, warmup: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per step of each closure, timed round by round after ``warmup`` rounds."""
    out: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(warmup + repeats):
        for k, fn in steps.items():
            t0 = time.perf_counter()
            fn()
            if i >= warmup:
                out[k].append(time.perf_counter() - t0)
    return out


def peak_rss_mib(args: argparse.Namespace, img_size: int, corruption: str, batch: int) -> dict:
    """Peak resident memory (MiB) of a fresh process running two steps of the configuration, and its rise over the
    process before the first step (model, optimizer and libraries loaded): what the step itself holds."""
    if args.no_memory:
        return {"peak_rss_mib": None, "step_mib": None}
    probe = [sys.executable, __file__, "--memory-probe", str(img_size), corruption, str(batch), "--arch", args.arch,
             "--backbone", args.backbone, "--patch-size", str(args.patch_size), "--precision", args.precision]
    if args.depth:
        probe += ["--depth", str(args.depth)]
    done = subprocess.run(probe, capture_output=True, text=True, check=True, env=os.environ)
    before, peak = (float(v) for v in done.stdout.split()[-2:])
    return {"peak_rss_mib": peak, "step_mib": peak - before}


def row(args: argparse.Namespace, img_size: int, batch: int, samples: dict[str, list[float]]) -> list[dict]:
    """Table rows of one (image size, batch): each corruption's median, its ratio to none, Π's share."""
    cfg = model_config(args, img_size, "rop")
    rop_ms = 1e3 * statistics.median(samples["rop"])
    ops = time_ops(batch, cfg.n_tokens, ROPIM(cfg).encoder.embed_dim, args.patch_size ** 2 * 3, cfg.rho,
                   reps=max(args.repeats, 10))
    rows = []
    for c, sec in samples.items():
        ms = 1e3 * statistics.median(sec)
        paired = statistics.median(a / b for a, b in zip(sec, samples["none"], strict=True))
        rows.append(dict(img_size=img_size, patch_size=args.patch_size, n_tokens=cfg.n_tokens, batch=batch,
                         corruption=c, ms_per_step=ms, img_per_s=batch / (ms / 1e3), x_none=paired,
                         **peak_rss_mib(args, img_size, c, batch),
                         pi_ms=ops["rop"] if c == "rop" else None,
                         pi_share=ops["rop"] / rop_ms if c == "rop" else None))
    return rows


def sweep(args: argparse.Namespace, sizes: list[tuple[int, int]]) -> list[dict]:
    """Rows for every (image size, batch) in ``sizes``."""
    rows = []
    for img_size, batch in sizes:
        steps = {c: train_step_fn(model_config(args, img_size, c), batch, args.precision) for c in CORRUPTIONS}
        print(f"  N={(img_size // args.patch_size) ** 2} (img {img_size}) batch {batch} ...", flush=True)
        rows += row(args, img_size, batch, time_interleaved(steps, args.warmup, args.repeats))
    return rows


def workers_rows(args: argparse.Namespace) -> list[dict]:
    """The real pretraining job on 1 and 2 Ray Train workers sharing this machine's cores: steady img/s."""
    from ropim.train.driver import run
    from ropim.train.pretrain.config import PretrainConfig

    cores, rows = os.cpu_count() or 1, []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp}/mlflow.db"
        for img_size in args.worker_sizes:
            for workers in args.workers:
                cfg = PretrainConfig(
                    model=model_config(args, img_size, "rop"), global_batch_size=args.worker_batch, epochs=2,
                    num_workers=workers, cpus_per_worker=cores / workers, max_steps_per_epoch=args.worker_steps,
                    warmup_epochs=0, viz_every=0, log_every=1000, storage_path=f"{tmp}/runs",
                    run_name=f"w{workers}-{img_size}", registered_model="scaling-bench")
                metrics = run(cfg).metrics  # epoch 2's rate: the first epoch pays start-up
                rows.append(dict(img_size=img_size, n_tokens=cfg.model.n_tokens, workers=workers,
                                 threads_per_worker=max(1, cores // workers), global_batch=args.worker_batch,
                                 img_per_s=metrics["img_per_s"], data_wait_share=metrics["data_wait_share"]))
                print(f"  {workers} worker(s) img {img_size}: {rows[-1]['img_per_s']:.1f} img/s", flush=True)
    return rows


def fits(rows: list[dict]) -> dict:
    """Per corruption: the log-log slope of ms/step against N (batch fixed) between successive sizes and over all,
    and ms/step = c + a·N + b·N² with non-negative c, a, b (per-step overhead, per-token work, attention's N²), fitted
    in relative error;
    the log-log slope of Π's share."""
    from scipy.optimize import nnls

    out = {}
    for c in CORRUPTIONS:
        pts = sorted((r["n_tokens"], r["ms_per_step"]) for r in rows if r["corruption"] == c)
        n, ms = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
        if len(n) < 2:
            continue
        out[f"{c}_loglog_slope"] = float(np.polyfit(np.log(n), np.log(ms), 1)[0])
        out[f"{c}_local_slopes"] = {f"{int(n[i])}-{int(n[i + 1])}": float(np.log(ms[i + 1] / ms[i]) /
                                                                         np.log(n[i + 1] / n[i]))
                                    for i in range(len(n) - 1)}
        if len(n) >= 3:
            basis = np.stack([np.ones_like(n), n, n ** 2], 1)
            (c0, a, b), _ = nnls(basis / ms[:, None], np.ones_like(ms))  # relative error: every size counts
            out[f"{c}_fit_ms"] = {"per_step": float(c0), "per_token": float(a), "per_token2": float(b),
                                  "n_where_n2_equals_n": float(a / b) if b > 0 else None}
    share = sorted((r["n_tokens"], r["pi_share"]) for r in rows if r["pi_share"])
    if len(share) >= 2:
        out["pi_share_loglog_slope"] = float(np.polyfit(np.log([s[0] for s in share]),
                                                        np.log([s[1] for s in share]), 1)[0])
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 4, figsize=(19, 4.2))
    for c in CORRUPTIONS:
        pts = sorted((r["n_tokens"], r["ms_per_step"]) for r in report["tokens"] if r["corruption"] == c)
        ax[0].loglog(*zip(*pts, strict=True), "o-", label=c)
        pts = sorted((r["batch"], r["img_per_s"]) for r in report["batches"] if r["corruption"] == c)
        ax[2].semilogx(*zip(*pts, strict=True), "o-", label=c)
        pts = sorted((r["n_tokens"], r["step_mib"]) for r in report["tokens"] if r["corruption"] == c
                     and r["step_mib"] is not None)
        if pts:
            ax[3].loglog(*zip(*pts, strict=True), "o-", label=c)
    fit = report["fits"].get("rop_fit_ms")
    if fit:
        n = np.geomspace(min(r["n_tokens"] for r in report["tokens"]), max(r["n_tokens"] for r in report["tokens"]))
        ax[0].loglog(n, fit["per_step"] + fit["per_token"] * n + fit["per_token2"] * n ** 2, "k:",
                     label="rop fit: c + aN + bN²")
    share = sorted((r["n_tokens"], 100 * r["pi_share"]) for r in report["tokens"] if r["pi_share"])
    ax[1].semilogx(*zip(*share, strict=True), "o-", color="C0")
    ax[0].set(xlabel="tokens N", ylabel="ms / step", title=f"step time (batch {report['token_batch']})")
    ax[3].set(xlabel="tokens N", ylabel="MiB", title="peak memory of a step over the built model")
    ax[1].set(xlabel="tokens N", ylabel="% of the rop step", title="draw + Π + (I−Π), forward + backward")
    ax[2].set(xlabel="batch", ylabel="img / s", title=f"throughput at N={report['batch_tokens']}")
    for a in ax:
        a.grid(True, which="both", alpha=0.3)
    ax[0].legend()
    fig.suptitle(f"ROPIM step cost, {report['arch']} {report['backbone']} depth {report['depth']}, "
                 f"{report['precision']}, {report['threads']} threads, {report['cpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_tables(report: dict) -> None:
    print(f"\n{'N':>6} {'img':>5} {'batch':>5} {'corr':<5} {'ms/step':>9} {'img/s':>8} {'x none':>7} {'peak MiB':>9} "
          f"{'step MiB':>9} {'Π share':>8}")
    for r in report["tokens"] + report["batches"]:
        mem = f"{r['peak_rss_mib']:9.0f} {r['step_mib']:9.0f}" if r["peak_rss_mib"] else f"{'-':>9} {'-':>9}"
        share = f"{100 * r['pi_share']:7.2f}%" if r["pi_share"] else f"{'':>8}"
        print(f"{r['n_tokens']:>6} {r['img_size']:>5} {r['batch']:>5} {r['corruption']:<5} {r['ms_per_step']:9.1f} "
              f"{r['img_per_s']:8.1f} {r['x_none']:7.3f} {mem} {share}")
    for r in report["workers"]:
        print(f"workers {r['workers']} × {r['threads_per_worker']} threads, N={r['n_tokens']}: {r['img_per_s']:.1f} "
              f"img/s (data wait {100 * r['data_wait_share']:.1f}%)")
    print("fits:", json.dumps(report["fits"], indent=1))


def rss_mib(field: str) -> float:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) of this process, MiB (Linux ``/proc``)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def memory_probe(args: argparse.Namespace) -> None:
    """``--memory-probe IMG CORRUPTION BATCH``: print the resident memory (MiB) with the model and optimizer built,
    and the peak over two steps. The peak is reset first (``/proc/self/clear_refs``): a forked process starts with
    its parent's high-water mark, which ``getrusage``'s ``ru_maxrss`` keeps."""
    img_size, corruption, batch = int(args.memory_probe[0]), args.memory_probe[1], int(args.memory_probe[2])
    step = train_step_fn(model_config(args, img_size, corruption), batch, args.precision)
    Path("/proc/self/clear_refs").write_text("5")
    before = rss_mib("VmRSS")
    step()
    step()
    print(before, rss_mib("VmHWM"))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="vit_tiny_patch16_224")
    ap.add_argument("--backbone", default="beit", choices=["vit", "beit"])
    ap.add_argument("--depth", type=int, default=None, help="blocks (default 12)")
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--img-sizes", type=int, nargs="+", default=[64, 128, 224, 256, 384, 512],
                    help="image sizes of the token sweep (N = (img / patch)²)")
    ap.add_argument("--token-batch", type=int, default=8, help="batch of the token sweep")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32], help="batches at --batch-img")
    ap.add_argument("--batch-img", type=int, default=224)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="Ray Train worker counts ([] skips)")
    ap.add_argument("--worker-sizes", type=int, nargs="+", default=[64, 224])
    ap.add_argument("--worker-batch", type=int, default=16)
    ap.add_argument("--worker-steps", type=int, default=20, help="steps per epoch of the workers' job")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-memory", action="store_true", help="skip the per-configuration memory processes")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="the step's autocast; auto: what training picks on this CPU (ropim.train.speed)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes: depth 1, patch 8, seconds")
    ap.add_argument("--out", type=Path, default=RESULTS / "scaling.json")
    ap.add_argument("--memory-probe", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--replot", action="store_true", help="refit, print and plot --out's measurements; no timing")
    args = ap.parse_args(argv)
    args.precision = resolve_precision(args.precision, torch.device("cpu"))
    if args.tiny:
        args.depth, args.patch_size, args.img_sizes, args.batches, args.batch_img = 1, 8, [16, 32], [1, 2], 16
        args.worker_sizes, args.worker_batch, args.worker_steps, args.repeats = [16], 4, 2, 2
    return args


def cpu_name() -> str:
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.memory_probe:
        memory_probe(args)
        return {}
    if args.replot:
        report = json.loads(args.out.read_text())
        report["fits"] = fits(report["tokens"])
        return finish(report, args.out)
    t0 = time.perf_counter()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}", flush=True)
    tokens = sweep(args, [(s, args.token_batch) for s in args.img_sizes])
    batches = sweep(args, [(args.batch_img, b) for b in args.batches])
    report = dict(benchmark="scaling", step="draw corruption, forward, backward, AdamW step", arch=args.arch,
                  backbone=args.backbone, depth=args.depth or 12, patch_size=args.patch_size, precision=args.precision,
                  token_batch=args.token_batch, batch_tokens=(args.batch_img // args.patch_size) ** 2,
                  threads=torch.get_num_threads(), cpu=cpu_name(), torch=torch.__version__,
                  tokens=tokens, batches=batches, workers=workers_rows(args) if args.workers else [],
                  fits=fits(tokens))
    return finish({**report, **provenance("bench/scaling.py", argv, t0)}, args.out)


def finish(report: dict, out: Path) -> dict:
    """Print the tables, write the JSON and the plot."""
    print_tables(report)
    write_json(report, out)
    plot(report, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} (measured in {report['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
