"""Training-step time of the two backbones (``vit`` vs ``beit``, ropim.core.backbone) on CPU.

One step = patch_embed → ``encode_patch_embeddings`` → linear decoder (D → p²C) → L1 loss against the
patchified images → backward → AdamW step (β = (0.9, 0.95), wd 0.05). No corruption: this times the backbones.
Steps are interleaved (vit, beit, vit, beit, …) so the shared machine's drift hits both; after ``--warmup`` rounds
the median of ``--repeats`` rounds is reported per backbone, with ``beit / vit`` as the median of the per-round
ratios (and the ratio of medians beside it). A table on stdout, JSON with ``--out``.

    PYTHONPATH=. .venv/bin/python bench/backbone_step.py [--threads 2] [--batch-size 8] [--img-size 224]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import timm
import torch
from torch import nn

from ropim.core.backbone import create_encoder, encode_patch_embeddings, encoder_spec
from ropim.core.config import BACKBONES


def patchify(imgs: torch.Tensor, p: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, p²C) in patch_embed's token order."""
    b, c, h, w = imgs.shape
    x = imgs.reshape(b, c, h // p, p, w // p, p)
    return torch.einsum("bchpwq->bhwpqc", x).reshape(b, (h // p) * (w // p), p * p * c)


class Recon(nn.Module):
    """Encoder + linear decoder, L1 reconstruction loss."""

    def __init__(self, backbone: str, arch: str, img_size: int, patch_size: int, drop_path: float) -> None:
        super().__init__()
        self.encoder = create_encoder(*encoder_spec(backbone, arch, img_size=img_size, patch_size=patch_size,
                                                    drop_path_rate=drop_path))
        self.decoder = nn.Linear(self.encoder.embed_dim, patch_size**2 * 3)
        self.patch_size = patch_size

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        x = self.encoder.patch_embed(imgs)  # (B, N, D)
        z = encode_patch_embeddings(self.encoder, x)  # (B, N, D)
        return (self.decoder(z) - patchify(imgs, self.patch_size)).abs().mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="vit_tiny_patch16_224")
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--patch-size", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--drop-path", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    imgs = torch.randn(args.batch_size, 3, args.img_size, args.img_size)
    models = {b: Recon(b, args.arch, args.img_size, args.patch_size, args.drop_path).train() for b in BACKBONES}
    opts = {b: torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.05)
            for b, m in models.items()}
    times: dict[str, list[float]] = {b: [] for b in BACKBONES}
    for r in range(args.warmup + args.repeats):
        for b in BACKBONES:  # ABAB
            t0 = time.perf_counter()
            loss = models[b](imgs)
            loss.backward()
            opts[b].step()
            opts[b].zero_grad(set_to_none=True)
            dt = time.perf_counter() - t0
            if r >= args.warmup:
                times[b].append(dt)

    med = {b: statistics.median(t) for b, t in times.items()}
    paired = sorted(tb / tv for tv, tb in zip(times["vit"], times["beit"], strict=True))
    q = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    result = {
        "setting": {k: v for k, v in vars(args).items() if k != "out"},
        "params_m": {b: round(sum(p.numel() for p in m.encoder.parameters()) / 1e6, 3) for b, m in models.items()},
        "step_s": {b: [round(t, 4) for t in ts] for b, ts in times.items()},
        "median_step_s": {b: round(t, 4) for b, t in med.items()},
        "img_per_s": {b: round(args.batch_size / t, 2) for b, t in med.items()},
        "beit_over_vit_paired_median": round(statistics.median(paired), 3),
        "beit_over_vit_paired_p25_p75": [round(q[0], 3), round(q[2], 3)],
        "beit_over_vit_ratio_of_medians": round(med["beit"] / med["vit"], 3),
        "torch": torch.__version__, "timm": timm.__version__, "machine": platform.processor() or platform.machine(),
    }
    s = result["setting"]
    print(f"{s['arch']} {s['img_size']}²/{s['patch_size']} batch {s['batch_size']}, {s['threads']} threads, "
          f"drop path {s['drop_path']}, median of {s['repeats']} interleaved steps after {s['warmup']} warm-up")
    print(f"{'backbone':8s} {'params (M)':>10s} {'step (s)':>9s} {'img/s':>7s}")
    for b in BACKBONES:
        print(f"{b:8s} {result['params_m'][b]:10.3f} {med[b]:9.3f} {result['img_per_s'][b]:7.2f}")
    print(f"beit / vit: {result['beit_over_vit_paired_median']:.3f} (median of per-round ratios, p25–p75 "
          f"{result['beit_over_vit_paired_p25_p75'][0]:.3f}–{result['beit_over_vit_paired_p25_p75'][1]:.3f}; "
          f"ratio of medians {result['beit_over_vit_ratio_of_medians']:.3f})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
