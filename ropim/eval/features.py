"""Pooled features of a frozen encoder over a dataset. Pure torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Subset


class Cancelled(Exception):
    """An extraction stopped because its caller's ``cancelled`` said so (the job stopped)."""


@torch.no_grad()
def extract_features(encoder: torch.nn.Module, dataset: Dataset, batch_size: int = 256,
                     device: torch.device | str | None = None,
                     num_workers: int = 0,
                     cancelled: Callable[[], bool] | None = None,
                     progress: Callable[[int], object] | None = None,
                     order: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled features (N, D) and labels (N,) of ``dataset`` under ``encoder`` in eval mode (returned on CPU);
    images go to ``device`` (default: where the encoder's weights are). The encoder's train/eval mode is restored.
    ``cancelled`` is asked before each batch: True raises ``Cancelled`` (a job stopped while this ran beside it);
    ``progress`` is handed each batch's image count once it is done. ``order`` (a permutation of the indices): the
    order the images are read in (``ropim.data.sampling.dealt``); the features still come in the dataset's."""
    device = device or next(encoder.parameters()).device
    was_training = encoder.training
    encoder.eval()
    feats, labels = [], []
    try:
        # a generator of its own, so that the global one is left alone (evaluations may run beside training)
        order = list(order) if order is not None else None
        read = Subset(dataset, order) if order is not None else dataset
        loader = DataLoader(read, batch_size=batch_size, num_workers=num_workers, generator=torch.Generator())
        for x, y in loader:
            if cancelled is not None and cancelled():
                raise Cancelled(f"feature extraction cancelled after {len(feats)} of {len(loader)} batches")
            f = encoder.forward_head(encoder.forward_features(x.to(device)), pre_logits=True)
            feats.append(f.float().cpu())
            labels.append(torch.as_tensor(y))
            if progress is not None:
                progress(len(y))
    finally:
        encoder.train(was_training)
    features, labels = torch.cat(feats), torch.cat(labels)
    if order is not None:  # back to the dataset's order
        back = torch.as_tensor(order).argsort()
        features, labels = features[back], labels[back]
    if not torch.isfinite(features).all():  # a kNN or probe on NaN features still returns a chance-level number
        bad = int((~torch.isfinite(features)).any(1).sum())
        raise ValueError(f"the encoder gives non-finite features for {bad} of {len(features)} images: its weights "
                         "are broken (a diverged run?); nothing can be scored")
    return features, labels
