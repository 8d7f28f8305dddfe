"""A confusion matrix as a PNG heat map (rows normalised to recall). Matplotlib's Agg canvas, no global state."""

from __future__ import annotations

from pathlib import Path

import torch


def confusion_png(confusion, classes: list[str], path: Path, title: str) -> None:
    """A confusion-matrix heat map (rows normalised to recall) as a PNG."""
    from matplotlib.figure import Figure

    conf = torch.as_tensor(confusion, dtype=torch.float64)
    norm = conf / conf.sum(1, keepdim=True).clamp(min=1)
    k = len(classes)
    side = min(4 + 0.35 * k, 14)
    fig = Figure(figsize=(side + 1.5, side))
    ax = fig.add_subplot()
    im = ax.imshow(norm.numpy(), cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of true class")
    if k <= 30:
        ax.set_xticks(range(k), classes, rotation=90, fontsize=8, parse_math=False)  # '$' in a name is text
        ax.set_yticks(range(k), classes, fontsize=8, parse_math=False)
        if k <= 15:
            for i in range(k):
                for j in range(k):
                    if conf[i, j]:
                        ax.text(j, i, int(conf[i, j]), ha="center", va="center", fontsize=7,
                                color="black" if norm[i, j] > 0.5 else "white")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title, parse_math=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
