"""Linear probe of frozen features: standardised features, multinomial logistic regression (scikit-learn)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from ropim.eval.metrics import topk_accuracy


def fit_linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, c: float = 1.0, max_iter: int = 1000) -> Pipeline:
    """StandardScaler + LogisticRegression (L-BFGS, inverse L2 strength ``c``) fitted on the train features."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
    return probe.fit(train_x.float().cpu().numpy(), train_y.cpu().numpy())


def probe_scores(probe: Pipeline, x: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Class scores (N, n_classes) of a fitted probe; classes absent from its training labels score -inf."""
    logits = probe.decision_function(x.float().cpu().numpy())
    classes = probe.classes_
    if logits.ndim == 1:  # two classes: sklearn returns the positive class's margin only
        logits = np.stack([-logits, logits], axis=1)
    scores = torch.full((len(x), n_classes), float("-inf"), dtype=torch.float64)
    scores[:, torch.as_tensor(classes)] = torch.as_tensor(logits, dtype=torch.float64)
    return scores


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                 c: float = 1.0, max_iter: int = 1000, n_classes: int | None = None) -> dict[str, object]:
    """{'top1', 'top5' (%), 'scores' (V, K)} of a linear probe fitted on ``train`` and scored on ``val``."""
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    scores = probe_scores(fit_linear_probe(train_x, train_y, c, max_iter), val_x, n_classes)
    return {**topk_accuracy(scores, val_y), "scores": scores}
