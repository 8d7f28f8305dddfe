"""The CPU training step with each speed option, side by side in one process, at the shapes CPU users train:
``demo`` (32²/8, 6 blocks, batch 32: one worker's share of ``make demo``), ``cifar`` (32²/4, 6 blocks, batch 64:
``cifar_micro``) and ``t224`` (ViT-T/16 at 224², batch 8, the paper's ``beit``).

A step = draw the corruption, forward, backward, gradient clipping at 5.0, AdamW step, through the library
(``ropim.core.model``, ``ropim.train.speed``). Rows differ from ``plain`` (fp32, eager, torch's AdamW loop) in one
option: ``bf16`` autocast, ``compile`` (torch.compile, inductor), ``fused`` / ``foreach`` AdamW, ``channels_last``,
and ``compile+fused``; ``official`` and ``official bf16`` are the paper's own model and step (its dense Π, its BEiT
copy) in fp32 and under the same bf16 autocast as ``bf16``, imported at run time from a checkout you name with
``--official PATH`` (never shipped here). All rows of a shape are built first (compilation happens in the warm-up)
and then timed round by round; ``x plain`` is the median of the per-round ratios plain / row, which cancels the
machine's drift, and ``x official`` the same against the paper's model at the row's precision (``official bf16``
for ``bf16``, ``official`` for the fp32 rows). ``cpu ms`` is the process's CPU time per step (all threads; on a
busy machine the wall time grows while it waits for a core).

FLOPs: one step of the library and one of the paper's model are counted with ``torch.utils.flop_counter`` (matmuls,
convolutions and attention, forward and backward; elementwise work is not counted; the paper's dense Π products are
part of its count). ``TFLOP/s`` is that count over the row's median step time, ``of peak`` its fraction of the
CPU's peak for the row's precision: threads (at most one per core) × FLOPs per cycle from the ISA flags in
/proc/cpuinfo (``peak_flops``) × the clock, the ``CPU max MHz`` of ``lscpu`` or else ``cpu MHz`` of /proc/cpuinfo,
unless ``--clock-ghz`` gives a measured one (a virtual machine may list its time-stamp counter's rate, below the
cores' real clock). A large GEMM per precision on the same threads (``gemm``) shows how much of that peak a matmul
alone reaches. ``--profile`` adds the top operators of the plain, bf16 and official steps (torch.profiler). The
CPU's model and bf16 instruction flags are recorded. Table on stdout, JSON in ``bench/results/cpu_step.json``.

    PYTHONPATH=. python bench/cpu_step.py [--shapes demo cifar t224] [--official PATH/TO/ROPIM] [--profile]
    ONEDNN_MAX_CPU_ISA=AVX2 PYTHONPATH=. python bench/cpu_step.py ...   # as on a CPU without native bf16
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from record import provenance, write_json  # bench/, beside this file
from timm.optim import create_optimizer_v2
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM, patchify
from ropim.train.speed import adamw_kernels, cpu_features

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {
    "demo": dict(backbone="vit", img_size=32, patch_size=8, depth=6, batch=32),
    "cifar": dict(backbone="vit", img_size=32, patch_size=4, depth=6, batch=64),
    "t224": dict(backbone="beit", img_size=224, patch_size=16, depth=None, batch=8),
    "t224vit": dict(backbone="vit", img_size=224, patch_size=16, depth=None, batch=8),
}
VARIANTS = ("plain", "bf16", "compile", "fused", "foreach", "channels_last", "compile+fused")
OFFICIAL = {"official": "fp32", "official bf16": "bf16"}  # the paper's model, at each precision


def library_step(shape: dict, variant: str):
    """One training step of the library's ROPIM with ``variant``'s option (fresh model, same initial weights)."""
    cfg = ModelConfig(arch="vit_tiny_patch16_224", backbone=shape["backbone"], img_size=shape["img_size"],
                      patch_size=shape["patch_size"], depth=shape["depth"])
    torch.manual_seed(0)
    model = ROPIM(cfg).train()
    channels_last = variant == "channels_last"
    if channels_last:
        model.to(memory_format=torch.channels_last)
    kernels = "fused" if "fused" in variant else "foreach" if variant == "foreach" else "default"
    opt = create_optimizer_v2(model, "adamw", lr=1e-4, weight_decay=0.05, betas=(0.9, 0.95), **adamw_kernels(kernels))
    forward = torch.compile(model) if "compile" in variant else model
    imgs = torch.randn(shape["batch"], 3, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(7))
    if channels_last:
        imgs = imgs.contiguous(memory_format=torch.channels_last)
    gen = torch.Generator().manual_seed(1)

    def step() -> float:
        corruption = model.draw_corruption(imgs.shape[0], gen)  # outside the compiled region, as in training
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant == "bf16"):
            loss = forward(imgs, corruption=corruption)[0]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    return step


def official_step(shape: dict, checkout: Path, bf16: bool = False):
    """The paper's code: its VisionTransformerForROPIM + conv decoder (models/ropim.py), a dense (B, N, N) Π applied
    to the patch embeddings and to the residual by matmul, L1, clipping 5.0, AdamW — as its main_ropim.py does; with
    ``bf16`` its forward and loss under the bf16 autocast the library's ``bf16`` row uses."""
    sys.path.insert(0, str(checkout))
    official = importlib.import_module("models.ropim")
    from functools import partial

    from ropim.core.sketch import draw_sketch

    torch.manual_seed(0)
    p, n = shape["patch_size"], (shape["img_size"] // shape["patch_size"]) ** 2
    encoder = official.VisionTransformerForROPIM(
        sp=True, img_size=shape["img_size"], patch_size=p, in_chans=3, num_classes=0, embed_dim=192,
        depth=shape["depth"] or 12, num_heads=3, mlp_ratio=4, qkv_bias=True, drop_rate=0.0, drop_path_rate=0.1,
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6), init_values=0.1, use_abs_pos_emb=False,
        use_rel_pos_bias=False, use_shared_rel_pos_bias=True, use_mean_pooling=False)
    model = official.ROPIM(encoder, p).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.05)
    imgs = torch.randn(shape["batch"], 3, shape["img_size"], shape["img_size"],
                       generator=torch.Generator().manual_seed(7))
    gen, eye = torch.Generator().manual_seed(1), torch.eye(n)

    def step() -> float:
        pi = draw_sketch(imgs.shape[0], n, 1 / 7, generator=gen).dense()  # their loader builds it per image
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            rec = model(imgs, pi)
            residual = patchify(imgs - rec, p).transpose(1, 2)  # (B, p²C, N), their rev_PixelShuffle + flatten
            loss = torch.matmul(residual, eye - pi).abs().mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        return float(loss)

    return step


def cpu_flash_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's attention count for its CPU flash kernel, which ``torch.utils.flop_counter`` does not list."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def cpu_flash_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                             **kwargs) -> int:
    """torch's attention backward count for its CPU flash kernel."""
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def count_flops(step) -> int:
    """FLOPs of one step as ``torch.utils.flop_counter`` counts them (matmuls, convolutions, attention; forward and
    backward), with its attention formulas applied to the CPU flash kernel too."""
    aten = torch.ops.aten
    cpu_flash = {aten._scaled_dot_product_flash_attention_for_cpu: cpu_flash_flops,
                 aten._scaled_dot_product_flash_attention_for_cpu_backward: cpu_flash_backward_flops}
    with FlopCounterMode(display=False, custom_mapping=cpu_flash) as counter:
        step()
    return counter.get_total_flops()


def cpu_info() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo and lscpu's fields (empty where unavailable)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines():
            key, _, value = line.partition(":")
            info[key.strip()] = value.strip()
    except OSError:
        pass
    if shutil.which("lscpu"):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            key, _, value = line.partition(":")
            info[f"lscpu {key.strip()}"] = value.strip()
    return info


def peak_flops(threads: int, clock_ghz: float | None = None) -> dict:
    """Peak FLOP/s of ``threads`` cores for fp32 and bf16 matmuls: FMA lanes per cycle from the vendor and ISA flags
    × 2 FLOPs per FMA × the clock (``clock_ghz``, else lscpu's ``CPU max MHz``, else /proc/cpuinfo's ``cpu MHz``).

    fp32: Intel with AVX-512 has two 512-bit FMA units (32 lanes; some parts have one); other AVX2+FMA cores two
    256-bit units (16 lanes; AMD Zen 4 runs its AVX-512 on these, two halves per instruction); else 8 lanes.
    bf16: AMX-BF16 1024 lanes (a 16×32 by 32×16 tile product per 16 cycles); AVX512-BF16 twice the fp32 lanes
    (VDPBF16PS: two bf16 products into each fp32 lane); without either, bf16 runs at most at the fp32 rate."""
    info = cpu_info()
    flags = set(info.get("flags", "").split())
    intel = info.get("vendor_id") == "GenuineIntel"
    fp32 = 32 if intel and "avx512f" in flags else 16 if {"avx2", "fma"} <= flags else 8
    bf16 = 1024 if "amx_bf16" in flags else 2 * fp32 if "avx512_bf16" in flags else fp32
    listed = info.get("lscpu CPU max MHz") or info.get("cpu MHz")
    listed_ghz = float(listed) / 1e3 if listed else None
    ghz = clock_ghz or listed_ghz
    cores = min(threads, os.cpu_count() or threads)
    how = (f"{cores} cores x FMA lanes per cycle from the vendor ({info.get('vendor_id')}) and ISA flags of "
           f"/proc/cpuinfo x 2 FLOPs per FMA x {ghz} GHz ("
           + ("given with --clock-ghz" if clock_ghz else "lscpu CPU max MHz" if info.get("lscpu CPU max MHz")
              else "/proc/cpuinfo cpu MHz") + f"; listed: {listed_ghz} GHz)")
    return dict(cores=cores, clock_ghz=ghz, listed_clock_ghz=listed_ghz, fma_lanes=dict(fp32=fp32, bf16=bf16),
                fp32=cores * fp32 * 2 * ghz * 1e9 if ghz else None, bf16=cores * bf16 * 2 * ghz * 1e9 if ghz else None,
                how=how)


def gemm_rates(size: int = 2048, repeats: int = 5) -> dict[str, float]:
    """FLOP/s of a ``size``³ matmul in fp32 and in bf16 on this process's threads (best of ``repeats``)."""
    rates = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = (torch.randn(size, size, generator=torch.Generator().manual_seed(i)).to(dtype) for i in (0, 1))
        a @ b
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
        rates[name] = 2 * size**3 / best
    return rates


def top_ops(step, rows: int = 8) -> list[dict]:
    """The operators of one step with the most self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:rows]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    return [dict(op=e.key, self_ms=e.self_cpu_time_total / 1e3, share=e.self_cpu_time_total / total,
                 calls=e.count) for e in events]


def precision(variant: str) -> str:
    """The precision a row runs at."""
    return OFFICIAL.get(variant, "bf16" if variant == "bf16" else "fp32")


def run_shape(name: str, args: argparse.Namespace, peak: dict) -> dict:
    shape = SHAPES[name]
    variants = [v for v in VARIANTS if v in args.variants]
    if args.official and shape["backbone"] == "beit":
        variants += [v for v in OFFICIAL if precision(v) == "fp32" or "bf16" in args.variants]
    steps, first_s = {}, {}
    for v in variants:
        t0 = time.perf_counter()
        steps[v] = (official_step(shape, args.official, bf16=precision(v) == "bf16") if v in OFFICIAL
                    else library_step(shape, v))
        for _ in range(args.warmup):
            steps[v]()
        first_s[v] = time.perf_counter() - t0
        print(f"  {name} {v}: built + {args.warmup} warm-up steps in {first_s[v]:.1f} s", flush=True)
    sec: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}  # this process's CPU seconds (all threads)
    for _ in range(args.repeats):
        for v in variants:
            t0, c0 = time.perf_counter(), time.process_time()
            steps[v]()
            sec[v].append(time.perf_counter() - t0)
            cpu[v].append(time.process_time() - c0)
    def ratio(ref: str, v: str) -> float | None:  # median over rounds of ref / v
        return statistics.median(a / b for a, b in zip(sec[ref], sec[v], strict=True)) if ref in sec else None

    flops = {"library": count_flops(steps["plain"])}
    if "official" in steps:
        flops["official"] = count_flops(steps["official"])
    rows = []
    for v in variants:
        ms, prec = 1e3 * statistics.median(sec[v]), precision(v)
        official = v in OFFICIAL
        counted = flops["official" if official else "library"]
        rows.append(dict(shape=name, variant=v, **shape, precision=prec, ms_per_step=ms,
                         img_per_s=shape["batch"] / ms * 1e3, x_plain=ratio("plain", v),
                         x_official=None if official else ratio(f"official{' bf16' if prec == 'bf16' else ''}", v),
                         flops_per_step=counted, flop_per_s=counted / ms * 1e3,
                         of_peak=counted / ms * 1e3 / peak[prec] if peak[prec] else None,
                         cpu_ms_per_step=1e3 * statistics.median(cpu[v]), warmup_s=first_s[v],
                         ms_samples=[1e3 * s for s in sec[v]]))
    profiles = {v: top_ops(steps[v]) for v in ("plain", "bf16", *OFFICIAL) if args.profile and v in steps}
    return dict(rows=rows, flops=flops, profiles=profiles)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["demo", "cifar", "t224"])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--official", type=Path, default=None, help="a checkout of the paper's code (its models/ folder)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per row (compilation happens here)")
    ap.add_argument("--repeats", type=int, default=8, help="timed rounds")
    ap.add_argument("--profile", action="store_true", help="top operators of the plain, bf16 and official steps")
    ap.add_argument("--clock-ghz", type=float, default=None,
                    help="the cores' clock for the peak (default: lscpu's CPU max MHz, else /proc/cpuinfo's cpu MHz)")
    ap.add_argument("--out", type=Path, default=RESULTS / "cpu_step.json")
    args = ap.parse_args(argv)
    if "plain" not in args.variants:
        ap.error("--variants must include plain (the reference of every ratio)")
    if args.official and not (args.official / "models" / "ropim.py").is_file():
        ap.error(f"--official {args.official}: no models/ropim.py there; give a checkout of the paper's ROPIM code")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    features, load_start = cpu_features(), list(os.getloadavg())
    print(f"{features['model']}; torch {torch.__version__}, {torch.get_num_threads()} threads, native bf16: "
          f"{features['native_bf16']}, load {os.getloadavg()[0]:.1f}", flush=True)
    t0, shapes = time.perf_counter(), {}
    peak = peak_flops(torch.get_num_threads(), args.clock_ghz)
    gemm = {k: dict(flop_per_s=v, of_peak=v / peak[k] if peak[k] else None) for k, v in gemm_rates().items()}
    print(f"peak: {peak['how']}: fp32 {peak['fp32'] / 1e12:.3f}, bf16 {peak['bf16'] / 1e12:.3f} TFLOP/s; a 2048³ "
          "GEMM reaches " + ", ".join(f"{k} {v['flop_per_s'] / 1e12:.3f} ({v['of_peak']:.0%})" for k, v in gemm.items())
          if peak["fp32"] else "peak: no clock known (give --clock-ghz)", flush=True)
    for name in args.shapes:
        shapes[name] = run_shape(name, args, peak)
    print(f"\n{'shape':<8} {'variant':<14} {'ms/step':>9} {'cpu ms':>8} {'img/s':>8} {'x plain':>8} "
          f"{'x official':>10} {'TFLOP/s':>8} {'of peak':>8} {'warm-up s':>10}")
    for r in (r for s in shapes.values() for r in s["rows"]):
        x_official = f"{r['x_official']:10.2f}" if r["x_official"] is not None else f"{'':>10}"
        of_peak = f"{r['of_peak']:8.1%}" if r["of_peak"] is not None else f"{'':>8}"
        print(f"{r['shape']:<8} {r['variant']:<14} {r['ms_per_step']:9.1f} {r['cpu_ms_per_step']:8.1f} "
              f"{r['img_per_s']:8.1f} {r['x_plain']:8.2f} {x_official} {r['flop_per_s'] / 1e12:8.3f} {of_peak} "
              f"{r['warmup_s']:10.1f}")
    for name, s in shapes.items():
        for v, ops in s["profiles"].items():
            print(f"{name} {v}: " + ", ".join(f"{o['op']} {100 * o['share']:.0f}% ({o['self_ms']:.0f} ms)"
                                               for o in ops[:5]))
    report = dict(benchmark="cpu_step", step="draw corruption, forward, backward, clip 5.0, AdamW step",
                  cpu=features, torch=torch.__version__, threads=torch.get_num_threads(), peak=peak, gemm=gemm,
                  load_avg_start=load_start,
                  **provenance("bench/cpu_step.py", argv, t0),
                  official=bool(args.official), warmup=args.warmup, repeats=args.repeats,
                  onednn_max_cpu_isa=os.environ.get("ONEDNN_MAX_CPU_ISA"),  # set: oneDNN limited to that ISA
                  shapes=shapes)
    report["command"] = report["command"].replace(str(args.official), "PATH/TO/ROPIM") if args.official else \
        report["command"]
    write_json(report, args.out)
    print(f"wrote {args.out} ({report['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
