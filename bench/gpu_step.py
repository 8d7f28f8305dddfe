"""One ROPIM training step (draw the corruption, forward, backward, AdamW step) on one device, each speed option on
and off, through the library's own code (``ropim.core.model``, ``ropim.train.speed``).

Per model × backbone × corruption: the ``plain`` step (the library's defaults: fp32, eager, torch's AdamW kernels,
scatter/gather Π, images on the device) and one row per option, differing from ``plain`` in that option only:
``bf16`` autocast, ``compile`` (torch.compile of the model, the corruption drawn outside as in training), ``fused``
AdamW, ``dense`` Π (the (B, N, N) matrix the library never builds, in a batched matmul), ``channels_last``, ``tf32``,
``pageable`` / ``pinned`` (the batch copied from host memory every step, blocking / non-blocking), and ``all`` (bf16
+ compile + fused + channels_last + tf32 where they run). Step time: median of the timed steps after warm-up (CUDA
events on GPU). GFLOP/img: forward + backward by torch.utils.flop_counter; MFU = model FLOP/s / the device's dense
bf16 peak (``gpu_devices.PEAKS``; an unknown device says so). A table on stdout; JSON in
``bench/results/gpu_step_<device>.json``.

    python bench/gpu_step.py --models vit_t vit_s vit_b --batch-size 128 --steps 20 [--explain]
    python bench/gpu_step.py --tiny            # the whole path on CPU in seconds (compile skipped unless asked)
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import shlex
import statistics
import sys
import time
from pathlib import Path

import timm
import torch
from gpu_devices import device_info, unsupported  # bench/, beside this file
from timm.optim import create_optimizer_v2
from torch.utils.flop_counter import FlopCounterMode

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM
from ropim.train.speed import adamw_kernels, images_to, tf32_matmuls

MODELS = {"vit_t": dict(arch="vit_tiny_patch16_224"), "vit_s": dict(arch="vit_small_patch16_224"),
          "vit_b": dict(arch="vit_base_patch16_224"),
          "cpu": dict(arch="vit_tiny_patch16_224", img_size=32, patch_size=4, depth=6)}
OPTIONS = ("bf16", "compile", "fused", "dense", "channels_last", "tf32", "pageable", "pinned", "all")
CORRUPTIONS = ("rop", "mask", "none")
RESULTS = Path(__file__).resolve().parent / "results"



class Unavailable(Exception):
    """A configuration this device cannot run; the message says why."""


@dataclasses.dataclass(frozen=True)
class Step:
    """How one training step runs; the defaults are the plain step."""

    bf16: bool = False
    compile: bool = False
    adamw: str = "default"  # ropim's SpeedOptions.adamw: default | foreach | fused
    dense: bool = False
    channels_last: bool = False
    tf32: bool = False
    h2d: str = "none"  # none (images on the device) | pageable | pinned (copied from host memory every step)


class DenseProjection:
    """Π as dense (B, N, N) matrices applied with a batched matmul: the N×N form the library never builds."""

    def __init__(self, sketch) -> None:
        self.pi = sketch.dense()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        return torch.bmm(self.pi.to(x.dtype), x)

    def complement(self, x: torch.Tensor) -> torch.Tensor:
        return x - self.project(x)


def step_for(variant: str, corruption: str, why: dict[str, str]) -> Step:
    """The Step of one table row; raises Unavailable where the option does not run here."""
    if variant in why:
        raise Unavailable(why[variant])
    if variant == "dense" and corruption != "rop":
        raise Unavailable("dense Π applies to corruption=rop only")
    if variant == "all":
        return Step(bf16="bf16" not in why, compile="compile" not in why, adamw="default" if "fused" in why
                    else "fused", channels_last=True, tf32="tf32" not in why)
    fields = {"plain": {}, "fused": {"adamw": "fused"}, "pageable": {"h2d": "pageable"}, "pinned": {"h2d": "pinned"}}
    return Step(**fields.get(variant, {variant: True}))


def rss_mib() -> float:
    """Resident set size of this process in MiB (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def count_flops(model: ROPIM, imgs: torch.Tensor, corruption) -> float:
    """FLOPs of one eager fp32 forward + backward of the batch."""
    with FlopCounterMode(display=False) as counter:
        model(imgs, corruption=corruption)[0].backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def time_steps(train_step, warmup: int, steps: int, cuda: bool) -> tuple[list[float], float | None]:
    """Sorted seconds of each timed step (CUDA events on GPU, perf_counter on CPU), and of the first warm-up step."""
    first_s = None
    for i in range(warmup):
        t0 = time.perf_counter()
        train_step()
        torch.cuda.synchronize() if cuda else None
        first_s = time.perf_counter() - t0 if i == 0 else first_s
    events, sec = [], []
    for _ in range(steps):
        if cuda:
            events.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            events[-1][0].record()
            train_step()
            events[-1][1].record()
        else:
            t0 = time.perf_counter()
            train_step()
            sec.append(time.perf_counter() - t0)
    torch.cuda.synchronize() if cuda else None
    return sorted(sec + [start.elapsed_time(end) / 1e3 for start, end in events]), first_s


def run_row(cfg: ModelConfig, step: Step, imgs: torch.Tensor, args: argparse.Namespace, flops: float) -> dict:
    """Time ``step`` on a fresh model (the same initial weights in every row); ``flops``: of the plain step."""
    device, cuda, batch = imgs.device, imgs.device.type == "cuda", imgs.shape[0]
    torch.manual_seed(0)
    model = ROPIM(cfg).to(device).train()
    if step.channels_last:
        model.to(memory_format=torch.channels_last)
    opt = create_optimizer_v2(model, "adamw", lr=1.5e-4, weight_decay=0.05, betas=(0.9, 0.95),
                              **adamw_kernels(step.adamw))
    gen = torch.Generator(device=device).manual_seed(123)
    c = model.draw_corruption(batch, gen)
    step_flops = count_flops(model, imgs, DenseProjection(c)) if step.dense else flops
    if step.dense:  # the dense form computes the library's loss
        with torch.no_grad():
            a, b = (float(model(imgs, corruption=x)[0]) for x in (c, DenseProjection(c)))
        if abs(a - b) > 1e-3 * abs(a):  # fp32 sums in another order through 6+ blocks: ~1e-4 apart on CPU
            raise RuntimeError(f"dense Π loss {b} != scatter Π loss {a}")
    forward = torch.compile(model, backend=args.compile_backend) if step.compile else model
    host = imgs.cpu().pin_memory() if step.h2d == "pinned" else imgs.cpu()
    rss: list[float] = []

    def train_step() -> None:
        x = images_to(host, device, step.channels_last, non_blocking=step.h2d == "pinned") if step.h2d != "none" \
            else images_to(imgs, device, step.channels_last)
        corruption = model.draw_corruption(batch, gen)  # outside the compiled region, as in training
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=step.bf16):
            loss = forward(x, corruption=DenseProjection(corruption) if step.dense else corruption)[0]
        rss.append(0.0 if cuda else rss_mib())  # activations alive: near the step's peak
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with tf32_matmuls(step.tf32):
        sec, first_s = time_steps(train_step, args.warmup, args.steps, cuda)
    med = statistics.median(sec)
    return dict(settings=dataclasses.asdict(step), ms_per_step=1e3 * med, ms_p25=1e3 * sec[len(sec) // 4],
                ms_p75=1e3 * sec[(3 * len(sec)) // 4], img_per_s=batch / med, first_step_s=first_s,
                peak_mem_mib=torch.cuda.max_memory_allocated(device) / 2**20 if cuda else max(rss),
                mem_kind="cuda_max_memory_allocated" if cuda else "process_rss_after_forward",
                gflop_per_img=flops / batch / 1e9, step_gflop_per_img=step_flops / batch / 1e9)


def explain(cfg: ModelConfig, imgs: torch.Tensor) -> dict:
    """torch._dynamo.explain of the compiled call (the model, corruption drawn outside): graphs and breaks."""
    model = ROPIM(cfg).to(imgs.device).train()
    c = model.draw_corruption(imgs.shape[0], torch.Generator(device=imgs.device).manual_seed(0))
    torch._dynamo.reset()
    e = torch._dynamo.explain(model)(imgs, corruption=c)
    torch._dynamo.reset()
    reasons = sorted({r.reason.strip().splitlines()[0] for r in e.break_reasons})
    print(f"  explain {cfg.backbone} {cfg.corruption}: {e.graph_count} graphs, {e.graph_break_count} graph breaks "
          + "; ".join(reasons))
    return dict(graphs=e.graph_count, graph_breaks=e.graph_break_count, reasons=reasons)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=["vit_t", "vit_s", "vit_b"])
    ap.add_argument("--backbones", nargs="+", choices=["vit", "beit"], default=["vit", "beit"])
    ap.add_argument("--corruptions", nargs="+", choices=CORRUPTIONS, help="default rop (--tiny: all three)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per row (median reported)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per row first (compilation happens here)")
    ap.add_argument("--options", nargs="*", choices=OPTIONS, help="options to time (default: all)")
    ap.add_argument("--depth", type=int, default=None, help="override the number of blocks")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile backend (aot_eager: no C++ build)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/gpu_step_<device>.json)")
    ap.add_argument("--explain", action="store_true", help="print torch._dynamo.explain graph breaks per corruption")
    ap.add_argument("--tiny", action="store_true", help="the CPU model at depth 1, batch 4, 2 steps, on CPU")
    args = ap.parse_args(argv)
    if args.tiny:
        args.models, args.depth, args.batch_size, args.steps, args.warmup, args.device = ["cpu"], 1, 4, 2, 1, "cpu"
    args.corruptions = args.corruptions or (list(CORRUPTIONS) if args.tiny else ["rop"])
    args.skip_compile = args.tiny and args.options is None
    args.options = list(OPTIONS) if args.options is None else args.options
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 1 or (args.depth is not None and args.depth < 1):
        ap.error("need --batch-size, --steps, --warmup (compilation happens there) and --depth ≥ 1")
    return args


def measure(args: argparse.Namespace, device: torch.device, peak: float | None, why: dict, save=lambda *_: None
            ) -> tuple[list, list, dict]:
    """(rows, skipped, explained) over models × backbones × corruptions × (plain + options); ``save(rows, skipped,
    explained)`` after every row, so that a run stopped early keeps what it measured."""
    rows, skipped, explained = [], [], {}
    for model_name in args.models:
        for backbone in args.backbones:
            for corruption in args.corruptions:
                key = dict(model=model_name, backbone=backbone, corruption=corruption)
                depth = {"depth": args.depth} if args.depth else {}
                cfg = ModelConfig(**{**MODELS[model_name], **depth}, backbone=backbone, corruption=corruption)
                imgs = torch.randn(args.batch_size, 3, cfg.img_size, cfg.img_size,
                                   generator=torch.Generator().manual_seed(7)).to(device)
                if args.explain:
                    explained["/".join(key.values())] = explain(cfg, imgs)
                probe = ROPIM(cfg).to(device).train()
                flops = count_flops(probe, imgs, probe.draw_corruption(args.batch_size, torch.Generator(device)))
                plain_ms = None
                for variant in ("plain", *[o for o in OPTIONS if o in args.options]):
                    print(f"{model_name} {backbone} {corruption} {variant}:", end=" ", flush=True)
                    try:
                        row = run_row(cfg, step_for(variant, corruption, why), imgs, args, flops)
                    except (Unavailable, torch.OutOfMemoryError, torch._dynamo.exc.BackendCompilerFailed) as e:
                        skipped.append(dict(key, variant=variant, reason=str(e).splitlines()[0]))
                        print(f"skipped: {skipped[-1]['reason']}")
                        continue
                    finally:
                        torch._dynamo.reset()
                        if device.type == "cuda":
                            gc.collect()
                            torch.cuda.empty_cache()
                    plain_ms = row["ms_per_step"] if variant == "plain" else plain_ms
                    achieved = row["gflop_per_img"] * 1e9 * row["img_per_s"]  # model FLOP/s
                    rows.append(dict(key, variant=variant, arch=cfg.arch, img_size=cfg.img_size, depth=cfg.depth,
                                     patch_size=cfg.patch_size, batch_size=args.batch_size, **row,
                                     speedup_vs_plain=plain_ms / row["ms_per_step"] if plain_ms else None,
                                     mfu=achieved / (peak * 1e12) if peak else None))
                    print(f"{row['ms_per_step']:.1f} ms/step")
                    save(rows, skipped, explained)
    return rows, skipped, explained


def print_table(rows: list[dict], skipped: list[dict]) -> None:
    print(f"\n{'model':<6} {'bb':<4} {'corr':<5} {'variant':<13} {'img/s':>9} {'ms/step':>9} {'peak MiB':>9} "
          f"{'GFLOP/img':>10} {'MFU':>7} {'x plain':>8}")
    for r in rows:
        mfu = f"{100 * r['mfu']:6.2f}%" if r["mfu"] is not None else "unknown"
        print(f"{r['model']:<6} {r['backbone']:<4} {r['corruption']:<5} {r['variant']:<13} {r['img_per_s']:9.1f} "
              f"{r['ms_per_step']:9.2f} {r['peak_mem_mib']:9.0f} {r['gflop_per_img']:10.3f} {mfu:>7} "
              f"{r['speedup_vs_plain']:8.2f}")
    for s in skipped:
        print(f"{s['model']:<6} {s['backbone']:<4} {s['corruption']:<5} {s['variant']:<13} skipped: {s['reason']}")


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    device = torch.device(args.device)
    name, peak, peak_source = device_info(device)
    print(f"{name}; torch {torch.__version__}, timm {timm.__version__}, {torch.get_num_threads()} threads, load "
          f"{os.getloadavg()[0]:.1f}; bf16 dense peak: {f'{peak} TFLOP/s ({peak_source})' if peak else peak_source}")
    why = unsupported(device)
    if args.skip_compile:
        why["compile"] = "--tiny skips compile (inductor's C++ build takes ~20 s per row on 2 CPU cores); add " \
                         "--options compile [--compile-backend aot_eager] to time it"
    t_start = time.perf_counter()
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower().split(":")[0]).strip("_")
    out = args.out or RESULTS / f"gpu_step_{slug}.json"

    def save(rows: list, skipped: list, explained: dict) -> dict:
        report = dict(benchmark="gpu_step", step="draw corruption, forward, backward, AdamW step, zero_grad",
                      device=str(device), device_name=name, peak_bf16_dense_tflops=peak, peak_source=peak_source,
                      torch=torch.__version__, timm=timm.__version__, python=platform.python_version(),
                      date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                      command=shlex.join(["python", *(sys.argv if argv is None else ["bench/gpu_step.py", *argv])]),
                      num_threads=torch.get_num_threads(), load_avg_end=list(os.getloadavg()),
                      batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                      compile_backend=args.compile_backend, wall_s=time.perf_counter() - t_start, rows=rows,
                      skipped=skipped, explain=explained or None)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        return report

    rows, skipped, explained = measure(args, device, peak, why, save)
    print_table(rows, skipped)
    report = save(rows, skipped, explained)
    print(f"wrote {out} ({report['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
