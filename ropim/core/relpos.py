"""A relative position bias table resampled to a new grid, as BEiT's fine-tuning code does it
(microsoft/unilm ``beit/run_class_finetuning.py``).

A table for a g×g grid holds (2g−1)² offsets (row-major, vertical offset first) and then 3 cls entries (cls→token,
token→cls, cls→cls). BEiT places the source offsets 0, ±1, ±(1 + q), ±(1 + q + q²), … (a geometric progression whose
ratio q ∈ [1.01, 1.5] is found by bisection so that the largest one reaches the new grid's largest offset), fits
scipy's ``interp2d(kind='cubic')`` through them — an interpolating bicubic spline, not-a-knot, evaluated clamped to
the source range — and reads it at the new integer offsets. Offsets 0 and ±1 keep their values; the 3 cls entries
are kept as they are.

timm's ``resize_rel_pos_bias_table`` uses the same positions but interpolates linearly unless scipy's ``interp2d``
is switched on, which SciPy 1.14 removed; so the spline is written here in torch (its 1-d weights, applied along
both axes).

Pure torch: no scipy, no Ray.
"""

from __future__ import annotations

import torch

N_CLS_ENTRIES = 3  # cls→token, token→cls, cls→cls


def geometric_positions(src: int, dst: int) -> list[float]:
    """BEiT's source offsets for ``src`` offsets per axis (2g−1) read at ``dst``: −p_k … −p_1, 0, p_1 … p_k with
    p_1 = 1 and p_{i+1} = p_i + q^i, q found by bisection (float64, as BEiT's Python floats)."""
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if (1.0 - q ** (src // 2)) / (1.0 - q) > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1.0
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(dis)] + [0.0] + dis


def spline_weights(x: list[float], t: torch.Tensor) -> torch.Tensor:
    """(len(t), len(x)) float64 matrix W such that W @ y is the not-a-knot cubic spline through (x, y) read at t
    (clamped to [x_0, x_-1]); through fewer than 4 points, the polynomial through them (what not-a-knot reduces to)."""
    xs = torch.tensor(x, dtype=torch.float64)
    m = len(x)
    t = t.to(torch.float64).clamp(xs[0], xs[-1])
    if m < 4:
        powers = torch.arange(m, dtype=torch.float64)
        return (t.unsqueeze(1) ** powers) @ torch.linalg.inv(xs.unsqueeze(1) ** powers)
    h = xs.diff()
    lhs, rhs = torch.zeros(m, m, dtype=torch.float64), torch.zeros(m, m, dtype=torch.float64)
    for i in range(1, m - 1):  # continuity of the first derivative at x_i, in the second derivatives M
        lhs[i, i - 1:i + 2] = torch.stack((h[i - 1], 2 * (h[i - 1] + h[i]), h[i]))
        rhs[i, i - 1:i + 2] = torch.stack((6 / h[i - 1], -6 / h[i - 1] - 6 / h[i], 6 / h[i]))
    lhs[0, :3] = torch.stack((h[1], -(h[0] + h[1]), h[0]))  # not-a-knot: third derivative continuous at x_1
    lhs[-1, -3:] = torch.stack((h[-1], -(h[-2] + h[-1]), h[-2]))  # … and at x_{m-2}
    second = torch.linalg.solve(lhs, rhs)  # (m, m): M = second @ y
    j = (torch.searchsorted(xs, t, right=True) - 1).clamp(0, m - 2)  # the piece [x_j, x_{j+1}] holding t
    hj, u, v = h[j], xs[j + 1] - t, t - xs[j]
    w = ((u**3 / hj - hj * u) / 6).unsqueeze(1) * second[j] + ((v**3 / hj - hj * v) / 6).unsqueeze(1) * second[j + 1]
    rows = torch.arange(len(t))
    w[rows, j] += u / hj
    w[rows, j + 1] += v / hj
    return w


def resize_rel_pos_bias_table(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """A ((2g−1)² + 3, heads) table of a square g×g grid ``old`` resampled to the square grid ``new`` the BEiT way
    (module docstring); the same table when the grids are equal. Same dtype and device."""
    if old[0] != old[1] or new[0] != new[1]:
        raise ValueError(f"relative position bias: square grids only (BEiT's), got {old} -> {new}")
    src, dst = 2 * old[0] - 1, 2 * new[0] - 1
    if table.shape[0] != src * src + N_CLS_ENTRIES:
        raise ValueError(f"relative position bias table of shape {tuple(table.shape)}: expected "
                         f"({src * src + N_CLS_ENTRIES}, heads) for a {old[0]}x{old[1]} grid")
    if src == dst:
        return table
    offsets, cls = table[:-N_CLS_ENTRIES], table[-N_CLS_ENTRIES:]
    half = dst // 2
    w = spline_weights(geometric_positions(src, dst), torch.arange(-half, half + 1, dtype=torch.float64))
    w = w.to(table.device)
    z = offsets.double().T.reshape(-1, src, src)  # (heads, vertical offset, horizontal offset)
    resampled = (w @ z @ w.T).reshape(-1, dst * dst).T  # (dst², heads)
    return torch.cat((resampled.to(table.dtype), cls), dim=0)
