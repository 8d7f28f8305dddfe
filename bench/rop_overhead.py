"""Training-step overhead of ROPIM's projection.

Times one training step (forward, backward, AdamW step) of the same ViT-T with

* ``rop``   — ROPIM as in the library: Π applied with scatter-add/gather, O(B·N·D);
* ``none``  — no corruption (plain reconstruction): the reference for the overhead;
* ``dense`` — the paper-code formulation: Π built as a batched (B, N, N) matrix with
  ``Sketch.dense()`` and applied with ``torch.bmm`` to the patch embeddings and to the
  loss residual (defined here, not in the library).

Repeats are interleaved (rop, none, dense, rop, none, dense, …) after a warm-up and the
median per variant is reported, with img/s. ``x none`` is the median over rounds of the
paired ratio (variant step / ``none`` step of the same round), which cancels the machine's
drift between rounds; its p25–p75 and the plain ratio of medians are printed beside it. The sketch draw and
the projection op alone (forward + backward) are timed too. Results: a table on stdout and
JSON (default ``bench/results/rop_overhead.json``). The issue's target: rop ≤ 1.02 × none.

    .venv/bin/python bench/rop_overhead.py [--repeats 15] [--warmup 3] [--settings ...] [--out ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from ropim.core.backbone import encode_patch_embeddings
from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM, patchify
from ropim.core.sketch import Sketch, draw_sketch

ARCH = "vit_tiny_patch16_224"
SETTINGS = {
    "vit_t16_224_b8": dict(img_size=224, patch_size=16, batch_size=8),
    "vit_t4_32_b64": dict(img_size=32, patch_size=4, batch_size=64),
}
VARIANTS = ("rop", "none", "dense")
TARGET = 1.02
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "rop_overhead.json"


class DenseROPIM(ROPIM):
    """ROPIM with Π as a dense batched N×N matrix applied by ``torch.bmm`` (the paper code's way)."""

    def forward(
        self, imgs: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, Sketch | None]:
        sketch = self.draw_sketch(imgs.shape[0], generator)
        pi = sketch.dense().to(imgs.dtype)  # (B, N, N)
        enc = self.encoder
        x = torch.bmm(pi, enc.patch_embed(imgs))  # Φ' = Π Φ
        pred = self.decoder(encode_patch_embeddings(enc, x))
        diff = patchify(imgs, self.cfg.patch_size) - pred
        diff = diff - torch.bmm(pi, diff)  # (I − Π)(X − X̃)
        loss = diff.abs().mean() if self.cfg.loss == "l1" else diff.pow(2).mean()
        return loss, pred, sketch


def build(variant: str, img_size: int, patch_size: int) -> tuple[ROPIM, torch.optim.Optimizer]:
    cfg = ModelConfig(
        arch=ARCH, img_size=img_size, patch_size=patch_size, corruption="none" if variant == "none" else "rop"
    )
    torch.manual_seed(0)  # identical initial weights for every variant
    model = (DenseROPIM if variant == "dense" else ROPIM)(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.05)
    return model, opt


def train_step(model: ROPIM, opt: torch.optim.Optimizer, imgs: torch.Tensor, gen: torch.Generator) -> float:
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss, _, _ = model(imgs, generator=gen)
    loss.backward()
    opt.step()
    return time.perf_counter() - t0


def time_ops(batch_size: int, n_tokens: int, embed_dim: int, pix_dim: int, rho: float, reps: int) -> dict:
    """Median ms of the corruption ops alone: draw; draw + Π Φ + (I − Π)·residual, forward + backward."""
    gen = torch.Generator().manual_seed(1)
    phi = torch.randn(batch_size, n_tokens, embed_dim, generator=gen, requires_grad=True)
    res = torch.randn(batch_size, n_tokens, pix_dim, generator=gen, requires_grad=True)
    g_phi, g_res = torch.randn_like(phi), torch.randn_like(res)

    def draw() -> None:
        draw_sketch(batch_size, n_tokens, rho, generator=gen)

    def rop() -> None:
        sk = draw_sketch(batch_size, n_tokens, rho, generator=gen)
        torch.autograd.backward([sk.project(phi), sk.complement(res)], [g_phi, g_res])

    def dense() -> None:
        pi = draw_sketch(batch_size, n_tokens, rho, generator=gen).dense()
        torch.autograd.backward([torch.bmm(pi, phi), res - torch.bmm(pi, res)], [g_phi, g_res])

    fns = {"draw": draw, "rop": rop, "dense": dense}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(reps + 3):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= 3:
                samples[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(v) for name, v in samples.items()}


def run_setting(name: str, img_size: int, patch_size: int, batch_size: int, repeats: int, warmup: int) -> dict:
    models = {v: build(v, img_size, patch_size) for v in VARIANTS}
    gens = {v: torch.Generator().manual_seed(123) for v in VARIANTS}
    imgs = torch.randn(batch_size, 3, img_size, img_size, generator=torch.Generator().manual_seed(7))
    cfg = models["rop"][0].cfg

    # the dense baseline computes the same thing as the library (same weights, same sketch)
    with torch.no_grad():
        loss_rop = models["rop"][0](imgs, generator=torch.Generator().manual_seed(5))[0]
        loss_dense = models["dense"][0](imgs, generator=torch.Generator().manual_seed(5))[0]
    rel = abs(float(loss_rop) - float(loss_dense)) / abs(float(loss_rop))
    if rel > 1e-4:
        raise RuntimeError(f"{name}: dense loss {float(loss_dense)} != rop loss {float(loss_rop)}")

    samples: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(warmup + repeats):
        for v in VARIANTS:
            dt = train_step(*models[v], imgs, gens[v])
            if i >= warmup:
                samples[v].append(dt)

    med = {v: statistics.median(samples[v]) for v in VARIANTS}
    variants = {}
    for v in VARIANTS:
        s = sorted(samples[v])
        # each round times every variant back to back: the per-round ratio cancels the machine's slow drift
        paired = sorted(a / b for a, b in zip(samples[v], samples["none"], strict=True))
        variants[v] = dict(
            ms_per_step=1e3 * med[v],
            img_per_s=batch_size / med[v],
            ratio_to_none=statistics.median(paired),
            ratio_to_none_p25=paired[len(paired) // 4],
            ratio_to_none_p75=paired[(3 * len(paired)) // 4],
            ratio_of_medians=med[v] / med["none"],
            ms_min=1e3 * s[0],
            ms_p25=1e3 * s[len(s) // 4],
            ms_p75=1e3 * s[(3 * len(s)) // 4],
            ms_samples=[1e3 * t for t in samples[v]],
        )
    enc = models["rop"][0].encoder
    ops = time_ops(batch_size, cfg.n_tokens, enc.embed_dim, patch_size**2 * 3, cfg.rho, reps=max(repeats, 20))
    return dict(
        arch=ARCH,
        img_size=img_size,
        patch_size=patch_size,
        batch_size=batch_size,
        n_tokens=cfg.n_tokens,
        n_buckets=draw_sketch(1, cfg.n_tokens, cfg.rho).n_buckets,
        depth=len(enc.blocks),
        rho=cfg.rho,
        check_rel_diff_rop_vs_dense_loss=rel,
        variants=variants,
        ops_ms=dict(
            draw=ops["draw"],
            rop_draw_project_complement_fwd_bwd=ops["rop"],
            dense_draw_dense_bmm_fwd_bwd=ops["dense"],
        ),
        ops_fraction_of_rop_step=dict(
            draw=ops["draw"] / variants["rop"]["ms_per_step"],
            rop=ops["rop"] / variants["rop"]["ms_per_step"],
            dense=ops["dense"] / variants["rop"]["ms_per_step"],
        ),
        rop_meets_target=variants["rop"]["ratio_to_none"] <= TARGET,
    )


def print_table(results: dict) -> None:
    print(f"\n{'setting':<16} {'variant':<7} {'ms/step':>9} {'p25':>8} {'p75':>8} {'img/s':>8} "
          f"{'x none':>7} {'(p25-p75)':>13} {'med/med':>8}")
    for name, r in results.items():
        for v in VARIANTS:
            s = r["variants"][v]
            print(
                f"{name:<16} {v:<7} {s['ms_per_step']:9.1f} {s['ms_p25']:8.1f} {s['ms_p75']:8.1f} "
                f"{s['img_per_s']:8.1f} {s['ratio_to_none']:7.3f} "
                f"{s['ratio_to_none_p25']:6.3f}-{s['ratio_to_none_p75']:5.3f} {s['ratio_of_medians']:8.3f}"
            )
        o, f = r["ops_ms"], r["ops_fraction_of_rop_step"]
        print(
            f"{'':<16} ops alone (fwd+bwd): draw {o['draw']:.3f} ms ({100 * f['draw']:.2f}% of rop step), "
            f"draw+Π+(I−Π) {o['rop_draw_project_complement_fwd_bwd']:.3f} ms ({100 * f['rop']:.2f}%), "
            f"dense draw+Π+2·bmm {o['dense_draw_dense_bmm_fwd_bwd']:.3f} ms ({100 * f['dense']:.2f}%)"
        )
        verdict = "meets" if r["rop_meets_target"] else "MISSES"
        print(f"{'':<16} rop/none = {r['variants']['rop']['ratio_to_none']:.3f}: {verdict} target <= {TARGET}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15, help="timed steps per variant (median reported)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per variant before timing")
    ap.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results path")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        ap.error(f"--repeats={args.repeats} --warmup={args.warmup}: need repeats >= 1 and warmup >= 0")

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load avg {os.getloadavg()}")
    t0 = time.perf_counter()
    results = {}
    for name in args.settings:
        print(f"running {name} ({args.warmup} warm-up + {args.repeats} repeats per variant)...", flush=True)
        results[name] = run_setting(name, **SETTINGS[name], repeats=args.repeats, warmup=args.warmup)
    print_table(results)
    report = dict(
        benchmark="rop_overhead",
        step="forward + backward + AdamW step",
        target_rop_over_none=TARGET,
        repeats=args.repeats,
        warmup=args.warmup,
        torch=torch.__version__,
        num_threads=torch.get_num_threads(),
        cpu_count=os.cpu_count(),
        platform=platform.platform(),
        load_avg_end=list(os.getloadavg()),
        wall_s=time.perf_counter() - t0,
        settings=results,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.out} ({report['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    main()
