"""The relative position bias table at a new resolution, against BEiT's method (microsoft/unilm
``beit/run_class_finetuning.py``) re-implemented here with numpy and scipy: geometric source offsets, a cubic
interpolating spline through them (``interp2d(kind='cubic')``, whose drop-in replacement on a grid is
``RectBivariateSpline(s=0)``), the 3 cls entries kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.interpolate import RectBivariateSpline
from timm.layers import resize_rel_pos_bias_table_simple

from ropim.core.relpos import resize_rel_pos_bias_table


def beit_offsets(src: int, dst: int) -> np.ndarray:
    """BEiT's source positions: 0, ±1, ±(1 + q), … with 1 + q + … + q^(k-1) ≈ dst // 2 (k = src // 2), q by
    bisection on [1.01, 1.5] to 1e-6."""
    k = src // 2
    lo, hi = 1.01, 1.5
    while hi - lo > 1e-6:
        q = (lo + hi) / 2
        lo, hi = (lo, q) if np.sum(q ** np.arange(k)) > dst // 2 else (q, hi)
    right = np.cumsum(np.concatenate(([1.0], q ** np.arange(1, k))))  # 1, 1 + q, 1 + q + q², …
    return np.concatenate((-right[::-1], [0.0], right))


def beit_resample(table: np.ndarray, g_old: int, g_new: int) -> np.ndarray:
    """BEiT's resampling of a ((2g−1)² + 3, heads) table, per head, cls entries appended unchanged."""
    src, dst = 2 * g_old - 1, 2 * g_new - 1
    x = beit_offsets(src, dst)
    t = np.arange(-(dst // 2), dst // 2 + 1, dtype=np.float64)
    heads = [RectBivariateSpline(x, x, table[:-3, i].reshape(src, src).astype(np.float64), kx=3, ky=3, s=0)(t, t)
             for i in range(table.shape[1])]
    return np.concatenate((np.stack(heads, axis=-1).reshape(dst * dst, -1), table[-3:]), axis=0)


def random_table(g: int, heads: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randn((2 * g - 1) ** 2 + 3, heads, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("g_old", "g_new"), [(4, 8), (8, 12), (14, 32), (12, 8), (3, 5)])
def test_matches_beits_geometric_bicubic_resampling(g_old, g_new):
    table = random_table(g_old)
    ours = resize_rel_pos_bias_table(table, (g_old, g_old), (g_new, g_new))
    assert ours.shape == ((2 * g_new - 1) ** 2 + 3, 3) and ours.dtype == table.dtype
    np.testing.assert_allclose(ours.numpy(), beit_resample(table.numpy(), g_old, g_new), rtol=0, atol=1e-5)


def test_small_offsets_and_the_cls_entries_keep_their_values():
    """Offsets 0 and ±1 (each axis) are source points in BEiT's layout, so a pretrained bias for a neighbour stays
    the neighbour's; the plain bicubic stretch reads offset 1 at about 0.43 of the old grid's step instead."""
    g_old, g_new = 14, 32  # ViT-B/16 pretrained at 224², segmentation at 512²
    table = random_table(g_old, heads=12)
    ours = resize_rel_pos_bias_table(table, (g_old, g_old), (g_new, g_new))
    old_grid, new_grid = table[:-3].reshape(27, 27, 12), ours[:-3].reshape(63, 63, 12)
    c_old, c_new = 13, 31  # offset 0 on each grid
    near = new_grid[c_new - 1:c_new + 2, c_new - 1:c_new + 2]
    torch.testing.assert_close(near, old_grid[c_old - 1:c_old + 2, c_old - 1:c_old + 2], rtol=0, atol=1e-5)
    assert torch.equal(ours[-3:], table[-3:])
    stretched = resize_rel_pos_bias_table_simple(table, new_window_size=(g_new, g_new), new_bias_shape=ours.shape)
    assert not torch.allclose(stretched[:-3].reshape(63, 63, 12)[c_new, c_new + 1], old_grid[c_old, c_old + 1])


@pytest.mark.parametrize(("g_old", "g_new"), [(8, 12), (2, 4)])
def test_a_bias_linear_in_beits_offsets_is_read_exactly(g_old, g_new):
    """A known answer: a bias a·y + b·x + c of BEiT's source positions (y, x) is read at the new integer offsets as
    a·y + b·x + c (a cubic spline, or the parabola through a 2x2 grid's 3 offsets, reproduces a linear function),
    clamped to the largest source position."""
    src, dst = 2 * g_old - 1, 2 * g_new - 1
    x = beit_offsets(src, dst)
    yy, xx = np.meshgrid(x, x, indexing="ij")
    heads = [(0.5, -0.25, 0.1), (-1.0, 2.0, 0.0)]
    bias = np.stack([a * yy + b * xx + c for a, b, c in heads], axis=-1).reshape(src * src, 2)
    table = torch.from_numpy(np.concatenate((bias, [[9.0, 9.0]] * 3)))
    ours = resize_rel_pos_bias_table(table, (g_old, g_old), (g_new, g_new))[:-3].reshape(dst, dst, 2)
    t = np.clip(np.arange(-(dst // 2), dst // 2 + 1, dtype=np.float64), x[0], x[-1])
    ty, tx = np.meshgrid(t, t, indexing="ij")
    expected = np.stack([a * ty + b * tx + c for a, b, c in heads], axis=-1)
    np.testing.assert_allclose(ours.numpy(), expected, rtol=0, atol=1e-9)


def test_same_grid_is_the_same_table_and_bad_shapes_raise():
    table = random_table(4)
    assert resize_rel_pos_bias_table(table, (4, 4), (4, 4)) is table
    with pytest.raises(ValueError, match="square grids only"):
        resize_rel_pos_bias_table(table, (4, 4), (4, 6))
    with pytest.raises(ValueError, match=r"expected \(28, heads\) for a 3x3 grid"):
        resize_rel_pos_bias_table(table, (3, 3), (6, 6))
