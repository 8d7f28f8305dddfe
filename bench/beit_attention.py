"""One ``beit`` block on CPU, forward and backward, as timm runs it (``Block.forward``: its fused attention,
``F.scaled_dot_product_attention`` with the shared relative position bias as a mask that needs a gradient) and as
ropim runs it on CPU (``ropim.core.attention.beit_block_unfused``: the same block with the attention written out), in
fp32 and under bf16 autocast. Rounds interleave the four rows; ``x timm`` is the median of the per-round ratios timm /
row at the row's precision. Also counts each row's ``aten::all`` calls (torch's math kernel scans every row of the
scores for -inf). Table on stdout, JSON in ``bench/results/beit_attention.json``.

    PYTHONPATH=. python bench/beit_attention.py [--threads 2] [--batch 8] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from record import provenance, write_json  # bench/, beside this file
from torch.profiler import ProfilerActivity, profile

from ropim.core.attention import beit_block_unfused
from ropim.core.backbone import create_encoder, encoder_spec
from ropim.train.speed import cpu_features

RESULTS = Path(__file__).resolve().parent / "results"


def block_step(blk: torch.nn.Module, x: torch.Tensor, rel_pos_bias: torch.nn.Module, ours: bool, bf16: bool):
    """Forward and backward of ``blk`` on ``x`` (a fresh leaf each call) with the shared bias ``rel_pos_bias()``,
    through timm's block or ropim's."""

    def step() -> None:
        h, bias = x.detach().requires_grad_(), rel_pos_bias()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = beit_block_unfused(blk, h, bias) if ours else blk(h, shared_rel_pos_bias=bias)
        out.float().square().mean().backward()

    return step


def all_calls(step) -> int:
    """How many aten::all calls one step makes."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::all")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, default=RESULTS / "beit_attention.json")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0, load_start = time.perf_counter(), list(os.getloadavg())
    torch.manual_seed(0)
    enc = create_encoder(*encoder_spec("beit", "vit_tiny_patch16_224", img_size=224, patch_size=16,
                                       drop_path_rate=0.1)).train()
    with torch.no_grad():  # a trained-looking bias, so that it matters
        enc.rel_pos_bias.relative_position_bias_table.normal_(0, 0.02)
    blk = enc.blocks[-1]
    x = torch.randn(args.batch, 1 + enc.patch_embed.num_patches, enc.embed_dim)
    rows = {f"{who} {prec}": block_step(blk, x, enc.rel_pos_bias, who == "ropim", prec == "bf16")
            for prec in ("fp32", "bf16") for who in ("timm", "ropim")}
    for step in rows.values():
        for _ in range(args.warmup):
            step()
    sec: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.repeats):
        for k, step in rows.items():
            s = time.perf_counter()
            step()
            sec[k].append(time.perf_counter() - s)
    out = []
    for k, step in rows.items():
        prec = k.split()[1]
        x_timm = statistics.median(a / b for a, b in zip(sec[f"timm {prec}"], sec[k], strict=True))
        out.append(dict(row=k, ms=1e3 * statistics.median(sec[k]), x_timm=x_timm, aten_all_calls=all_calls(step),
                        ms_samples=[1e3 * s for s in sec[k]]))
    print(f"{cpu_features()['model']}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {load_start[0]:.1f}\n{'row':<12} {'ms':>8} {'x timm':>7} {'aten::all':>10}")
    for r in out:
        print(f"{r['row']:<12} {r['ms']:8.2f} {r['x_timm']:7.2f} {r['aten_all_calls']:10d}")
    report = dict(benchmark="beit_attention", what="one beit block (ViT-T/16, 224², shared bias), forward + backward",
                  batch=args.batch, threads=torch.get_num_threads(), torch=torch.__version__, cpu=cpu_features(),
                  load_avg_start=load_start, warmup=args.warmup, repeats=args.repeats,
                  **provenance("bench/beit_attention.py", argv, t0), rows=out)
    write_json(report, args.out)
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
