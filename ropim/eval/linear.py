"""Linear probe of frozen features: standardised features, multinomial logistic regression (scikit-learn).

The fit is solved to the printed digit where that is cheap: with up to ``EXACT_MAX_UNKNOWNS`` weights ((features + 1)
× classes; 1,930 for the demo's 192-wide encoder on 10 digits) by Newton–Cholesky in float64 to a gradient tolerance
of 1e-8. On the demo's features its logits agree to 3e-13 across OpenBLAS kernels (SkylakeX, Haswell) and 1 or 2
threads, where the closest val image sits 5.6e-4 from a tie. scikit-learn's default L-BFGS stopped there 0.15 from the
optimum's logits, and its top-1 moved with the BLAS threads (random init: 85.79 with 1, 86.07 with 2); it remains the
solver of larger problems, whose Hessian would not fit. Newton–Cholesky runs with 1 BLAS / OpenMP thread unless told
otherwise (bit for bit the same on any core count, and on 2 busy cores also the fastest); L-BFGS with the machine's.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from ropim.eval.metrics import topk_accuracy

EXACT_MAX_UNKNOWNS = 4096  # Newton–Cholesky's Hessian: 4096² float64 = 128 MiB
EXACT_TOL = 1e-8


def fit_linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, c: float = 1.0, max_iter: int = 1000,
                     threads: int | None = None) -> Pipeline:
    """StandardScaler + LogisticRegression (inverse L2 strength ``c``) fitted on the train features: Newton–Cholesky
    in float64 when (features + 1) × classes ≤ ``EXACT_MAX_UNKNOWNS``, else L-BFGS in float32; ``threads`` BLAS /
    OpenMP threads (None: 1 for Newton–Cholesky, the machine's for L-BFGS)."""
    y = train_y.cpu().numpy()
    exact = (train_x.shape[1] + 1) * len(np.unique(y)) <= EXACT_MAX_UNKNOWNS
    x = (train_x.double() if exact else train_x.float()).cpu().numpy()
    solver = {"solver": "newton-cholesky", "tol": EXACT_TOL} if exact else {"solver": "lbfgs"}
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter, **solver))
    with threadpool_limits((threads or 1) if exact else threads):
        return probe.fit(x, y)


def probe_scores(probe: Pipeline, x: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Class scores (N, n_classes) of a fitted probe; classes absent from its training labels score -inf."""
    logits = probe.decision_function(x.cpu().numpy().astype(probe[-1].coef_.dtype))
    classes = probe.classes_
    if logits.ndim == 1:  # two classes: sklearn returns the positive class's margin only
        logits = np.stack([-logits, logits], axis=1)
    scores = torch.full((len(x), n_classes), float("-inf"), dtype=torch.float64)
    scores[:, torch.as_tensor(classes)] = torch.as_tensor(logits, dtype=torch.float64)
    return scores


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                 c: float = 1.0, max_iter: int = 1000, n_classes: int | None = None,
                 threads: int | None = None) -> dict[str, object]:
    """{'top1', 'top5' (%), 'scores' (V, K)} of a linear probe fitted on ``train`` and scored on ``val``."""
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    scores = probe_scores(fit_linear_probe(train_x, train_y, c, max_iter, threads), val_x, n_classes)
    return {**topk_accuracy(scores, val_y), "scores": scores}
