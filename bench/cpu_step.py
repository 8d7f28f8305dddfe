"""The CPU training step with each speed option, side by side in one process, at the shapes CPU users train:
``demo`` (32²/8, 6 blocks, batch 32: one worker's share of ``make demo``), ``cifar`` (32²/4, 6 blocks, batch 64:
``cifar_micro``) and ``t224`` (ViT-T/16 at 224², batch 8, the paper's ``beit``).

A step = draw the corruption, forward, backward, gradient clipping at 5.0, AdamW step, through the library
(``ropim.core.model``, ``ropim.train.speed``). Rows differ from ``plain`` (fp32, eager, torch's AdamW loop) in one
option: ``bf16`` autocast, ``compile`` (torch.compile, inductor), ``fused`` / ``foreach`` AdamW, ``channels_last``,
and ``compile+fused``; ``official`` is the paper's own model and step (its dense Π, its BEiT copy) imported at run
time from a checkout you name with ``--official PATH`` (never shipped here). All rows of a shape are built first
(compilation happens in the warm-up) and then timed round by round; ``x plain`` is the median of the per-round
ratios plain / row, which cancels the machine's drift. ``--profile`` adds the top operators of the plain and bf16
steps (torch.profiler): where bf16 spends its time on this CPU. The CPU's model and bf16 instruction flags are
recorded. Table on stdout, JSON in ``bench/results/cpu_step.json``.

    PYTHONPATH=. python bench/cpu_step.py [--shapes demo cifar t224] [--official PATH/TO/ROPIM] [--profile]
    ONEDNN_MAX_CPU_ISA=AVX2 PYTHONPATH=. python bench/cpu_step.py ...   # as on a CPU without native bf16
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from record import provenance, write_json  # bench/, beside this file
from timm.optim import create_optimizer_v2

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


def official_step(shape: dict, checkout: Path):
    """The paper's code: its VisionTransformerForROPIM + conv decoder (models/ropim.py), a dense (B, N, N) Π applied
    to the patch embeddings and to the residual by matmul, L1, clipping 5.0, AdamW — as its main_ropim.py does."""
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
        rec = model(imgs, pi)
        residual = patchify(imgs - rec, p).transpose(1, 2)  # (B, p²C, N), their rev_PixelShuffle + flatten
        loss = torch.matmul(residual, eye - pi).abs().mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        return float(loss)

    return step


def top_ops(step, rows: int = 8) -> list[dict]:
    """The operators of one step with the most self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:rows]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    return [dict(op=e.key, self_ms=e.self_cpu_time_total / 1e3, share=e.self_cpu_time_total / total,
                 calls=e.count) for e in events]


def run_shape(name: str, args: argparse.Namespace) -> dict:
    shape = SHAPES[name]
    variants = [v for v in VARIANTS if v in args.variants]
    if args.official and shape["backbone"] == "beit":
        variants.append("official")
    steps, first_s = {}, {}
    for v in variants:
        t0 = time.perf_counter()
        steps[v] = official_step(shape, args.official) if v == "official" else library_step(shape, v)
        for _ in range(args.warmup):
            steps[v]()
        first_s[v] = time.perf_counter() - t0
        print(f"  {name} {v}: built + {args.warmup} warm-up steps in {first_s[v]:.1f} s", flush=True)
    sec: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            t0 = time.perf_counter()
            steps[v]()
            sec[v].append(time.perf_counter() - t0)
    rows = []
    for v in variants:
        ms = 1e3 * statistics.median(sec[v])
        rows.append(dict(shape=name, variant=v, **shape, ms_per_step=ms, img_per_s=shape["batch"] / ms * 1e3,
                         x_plain=statistics.median(a / b for a, b in zip(sec["plain"], sec[v], strict=True)),
                         warmup_s=first_s[v], ms_samples=[1e3 * s for s in sec[v]]))
    profiles = {v: top_ops(steps[v]) for v in ("plain", "bf16") if args.profile and v in steps}
    return dict(rows=rows, profiles=profiles)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["demo", "cifar", "t224"])
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--official", type=Path, default=None, help="a checkout of the paper's code (its models/ folder)")
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per row (compilation happens here)")
    ap.add_argument("--repeats", type=int, default=8, help="timed rounds")
    ap.add_argument("--profile", action="store_true", help="top operators of the plain and bf16 steps")
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
    features = cpu_features()
    print(f"{features['model']}; torch {torch.__version__}, {torch.get_num_threads()} threads, native bf16: "
          f"{features['native_bf16']}, load {os.getloadavg()[0]:.1f}", flush=True)
    t0, shapes = time.perf_counter(), {}
    for name in args.shapes:
        shapes[name] = run_shape(name, args)
    print(f"\n{'shape':<8} {'variant':<14} {'ms/step':>9} {'img/s':>8} {'x plain':>8} {'warm-up s':>10}")
    for r in (r for s in shapes.values() for r in s["rows"]):
        print(f"{r['shape']:<8} {r['variant']:<14} {r['ms_per_step']:9.1f} {r['img_per_s']:8.1f} {r['x_plain']:8.2f} "
              f"{r['warmup_s']:10.1f}")
    for name, s in shapes.items():
        for v, ops in s["profiles"].items():
            print(f"{name} {v}: " + ", ".join(f"{o['op']} {100 * o['share']:.0f}% ({o['self_ms']:.0f} ms)"
                                               for o in ops[:5]))
    report = dict(benchmark="cpu_step", step="draw corruption, forward, backward, clip 5.0, AdamW step",
                  cpu=features, torch=torch.__version__, threads=torch.get_num_threads(),
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
