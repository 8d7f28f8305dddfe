"""Segmentation pictures: rows of image | ground truth | prediction, label maps in a fixed palette, with a colour
legend of the classes shown. Matplotlib's Agg canvas, no global state."""

from __future__ import annotations

import colorsys
from pathlib import Path

import numpy as np
import torch

from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD

IGNORE_COLOUR = (0.5, 0.5, 0.5)  # pixels without a label


def palette(num_classes: int) -> np.ndarray:
    """(K, 3) RGB colours in [0, 1], the same for every picture: hues spread by the golden ratio, two lightnesses."""
    return np.array([colorsys.hls_to_rgb((i * 0.618034) % 1.0, 0.45 if i % 2 else 0.6, 0.75)
                     for i in range(num_classes)])


def colour(labels: np.ndarray, colours: np.ndarray, ignore_index: int = 255) -> np.ndarray:
    """A label map (H, W) as an RGB image (H, W, 3) in [0, 1]; ignored or out-of-range pixels grey."""
    out = np.empty((*labels.shape, 3))
    out[:] = IGNORE_COLOUR
    known = (labels != ignore_index) & (labels < len(colours))
    out[known] = colours[labels[known]]
    return out


def segmentation_png(images: torch.Tensor, truth: torch.Tensor, pred: torch.Tensor, classes: list[str], path: Path,
                     title: str, ignore_index: int = 255) -> None:
    """A PNG of n rows: normalized images (n, 3, H, W) | ground truth (n, H, W) | prediction (n, H, W), and a legend
    of the classes that appear in them."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    colours = palette(len(classes))
    truth_np, pred_np = truth.cpu().numpy(), pred.cpu().numpy()
    shown = sorted((set(np.unique(truth_np).tolist()) | set(np.unique(pred_np).tolist())) - {ignore_index})
    shown = [int(c) for c in shown if c < len(classes)]
    n = len(images)
    fig = Figure(figsize=(9 + (2.5 if shown else 0), 3 * n + 0.6))
    axes = fig.subplots(n, 3, squeeze=False)
    for i in range(n):
        rgb = (images[i].cpu().float() * std + mean).clamp(0, 1).permute(1, 2, 0).numpy()
        for ax, picture, name in zip(axes[i], (rgb, colour(truth_np[i], colours, ignore_index),
                                               colour(pred_np[i], colours, ignore_index)),
                                     ("image", "ground truth", "prediction"), strict=True):
            ax.imshow(picture, interpolation="nearest")
            ax.set_axis_off()
            if i == 0:
                ax.set_title(name)
    if shown:
        handles = [Patch(color=colours[c], label=classes[c]) for c in shown[:40]]
        fig.legend(handles=handles, loc="center right", fontsize=8, frameon=False)
        fig.subplots_adjust(right=0.78)
    fig.suptitle(title)
    fig.savefig(path, dpi=80)
