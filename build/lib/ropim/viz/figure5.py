"""Figure 5 of the paper: the per-token error ROP and masking cause, as histograms side by side.

ROP corrupts tokens into ΠX (a fresh sketch per image), masking into diag(1 − m)X; ROP spreads the change over
(almost) every token, masking leaves the visible ones exact. Matplotlib's Agg canvas (no global backend switch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ropim.core.masking import draw_mask
from ropim.core.model import patchify
from ropim.core.sketch import draw_sketch


@dataclass
class TokenErrors:
    """Per-token ℓ1 errors (mean |corrupted − original| over a token's p²C normalized pixels)."""

    rop: np.ndarray  # (images × tokens,)
    mask: np.ndarray  # (images × tokens,)
    n_images: int
    n_tokens: int  # per image
    rho: float
    mask_ratio: float
    threshold: float

    def summary(self) -> dict[str, float | int]:
        """Counts and shares of tokens changed by more than ``threshold``, and mean errors: plain numbers."""
        total = self.n_images * self.n_tokens
        out: dict[str, float | int] = {
            "n_images": self.n_images, "tokens_per_image": self.n_tokens, "tokens": total,
            "rho": self.rho, "mask_ratio": self.mask_ratio, "threshold": self.threshold,
        }
        for name, err in (("rop", self.rop), ("mask", self.mask)):
            changed = int((err > self.threshold).sum())
            out |= {
                f"{name}_changed": changed,
                f"{name}_changed_share": changed / total,
                f"{name}_changed_per_image": changed / self.n_images,
                f"{name}_mean_error": float(err.mean()),
            }
        return out


@torch.no_grad()
def token_errors(imgs: torch.Tensor, patch_size: int, rho: float = 0.25, mask_ratio: float = 0.75,
                 threshold: float = 0.1, generator: torch.Generator | None = None,
                 hashing: str = "balanced") -> TokenErrors:
    """Figure 5 on normalized images (B, C, H, W): ROP corrupts tokens into ΠX (a fresh sketch per image),
    masking into diag(1 − m)X — masked tokens become 0, i.e. the dataset's mean colour — with exactly
    round(mask_ratio·N) patches masked per image. ROP spreads the change over (almost) every token;
    masking leaves the visible ones exact, so ROP changes more tokens by more than ``threshold``.
    """
    b, _, h, _ = imgs.shape
    n = (h // patch_size) ** 2
    device = generator.device if generator is not None else torch.device("cpu")
    x = patchify(imgs.detach().float().to(device), patch_size)
    sketch = draw_sketch(b, n, rho, generator=generator, device=device, hashing=hashing)
    n_masked = min(max(round(mask_ratio * n), 1), n - 1)
    mask = draw_mask(b, h, patch_size, patch_size, n_masked, generator=generator, device=device)
    rop = (sketch.project(x) - x).abs().mean(-1).reshape(-1).cpu().numpy()
    masked = (mask.project(x) - x).abs().mean(-1).reshape(-1).cpu().numpy()
    return TokenErrors(rop, masked, b, n, rho, mask_ratio, threshold)


def token_error_figure(errors: TokenErrors, path: str | Path | None = None, size: tuple[int, int] = (1000, 400)
                       ) -> Image.Image:
    """Histograms of the per-token errors, ROP | masking side by side, as an RGB image of ``size`` pixels
    (written as a PNG at ``path`` if given)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 100
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    top = float(max(errors.rop.max(), errors.mask.max(), errors.threshold)) * 1.02
    bins = np.linspace(0.0, top, 41)
    s = errors.summary()
    axes = fig.subplots(1, 2, sharey=True)
    for ax, name, err, label in (
        (axes[0], "rop", errors.rop, f"ROP, rho={errors.rho:g}"),
        (axes[1], "mask", errors.mask, f"masking, ratio={errors.mask_ratio:g}"),
    ):
        ax.hist(err, bins=bins, color="tab:blue" if name == "rop" else "tab:orange")
        ax.axvline(errors.threshold, color="k", linestyle="--", linewidth=1)
        ax.set_title(f"{label}: {s[f'{name}_changed']}/{s['tokens']} tokens changed > {errors.threshold:g}",
                     fontsize=10)
        ax.set_xlabel("per-token l1 error (normalized pixels)")
    axes[0].set_ylabel(f"tokens ({errors.n_images} images x {errors.n_tokens})")
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.14, top=0.9, wspace=0.08)
    canvas.draw()
    img = Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy())
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        img.save(path, format="PNG")
    return img


