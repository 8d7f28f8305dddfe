"""Downstream evaluation of encoders — the public names in one place.

* ``ropim.finetune``   fine-tuning with the paper's recipe on Ray Train (or in-process): ``FinetuneConfig``,
  ``finetune``, ``baseline``, ``evaluate_classifier``
* ``ropim.probe``      frozen features: ``extract_features``, ``knn_top1``, ``knn_eval``, ``linear_probe``,
  ``ProbeConfig``, ``probe``
* ``ropim.transfer``   every encoder × every data set, one table: ``TransferConfig``, ``transfer``
* ``ropim.downstream`` what they share: encoder resolution and checks, position-embedding resampling, results

Encoders come from any URI ``registry.load_encoder`` understands; every result is logged to MLflow with tags
naming the encoder version, and the version gets a ``downstream.<dataset>.…`` tag.
"""

from ropim.finetune import FinetuneConfig, baseline, evaluate_classifier, finetune
from ropim.probe import (
    ProbeConfig,
    extract_features,
    knn_eval,
    knn_probe,
    knn_scores,
    knn_top1,
    linear_probe,
    probe,
    train_linear_probe,
)
from ropim.transfer import TransferConfig, transfer

__all__ = [
    "FinetuneConfig", "ProbeConfig", "TransferConfig", "baseline", "evaluate_classifier", "extract_features",
    "finetune", "knn_eval", "knn_probe", "knn_scores", "knn_top1", "linear_probe", "probe", "train_linear_probe",
    "transfer",
]
