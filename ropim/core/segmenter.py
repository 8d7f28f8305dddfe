"""A segmenter from an encoder: the encoder rebuilt at the crop size the BEiT/SimMIM way (``build_classifier``: the
``vit`` absolute position embedding resampled; the ``beit`` shared relative position bias copied into every block,
its table resampled), then UperNet on top (``ropim.core.upernet``). The JSON config it returns rebuilds the
architecture with ``build_segmenter`` alone.

    seg = segmenter_from_encoder("vit_tiny_patch16_224", enc_kwargs, state, num_classes=11, crop_size=64)
    logits, aux = seg.model(x)          # training: (B, K, 4h, 4w), (B, K, h, w)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ropim.core.backbone import build_classifier
from ropim.core.upernet import UperNetViT, block_indices


@dataclass(frozen=True)
class Segmenter:
    """A segmentation model built from an encoder, its JSON config, and what was done to the encoder's weights."""

    model: UperNetViT
    config: dict
    actions: tuple[str, ...]

    def summary(self) -> str:
        """One line for the log."""
        return "; ".join(self.actions)


def segmenter_from_encoder(name: str, kwargs: dict, state: dict[str, torch.Tensor] | None, num_classes: int,
                           crop_size: int, *, drop_path: float = 0.1, channels: int = 768, aux_channels: int = 256,
                           dropout: float = 0.1) -> Segmenter:
    """UperNet on the encoder ``(name, kwargs)`` with weights ``state`` (None: random init) at ``crop_size``."""
    clf = build_classifier(name, kwargs, state, 0, crop_size, drop_path)
    indices = block_indices(len(clf.model.blocks))
    model = UperNetViT(clf.model, num_classes, channels, aux_channels, dropout, indices)
    config = {"arch": clf.name, "timm_kwargs": clf.kwargs, "num_classes": num_classes, "channels": channels,
              "aux_channels": aux_channels, "dropout": dropout, "indices": indices, "crop_size": crop_size,
              "patch_size": kwargs["patch_size"], "embed_dim": clf.model.embed_dim}
    actions = (*clf.actions, f"UperNet ({channels} channels) on blocks {[i + 1 for i in indices]} of "
                             f"{len(indices) and max(indices) + 1}, auxiliary FCN head on block {indices[2] + 1}")
    return Segmenter(model, config, actions)


def seg_loss(outputs: torch.Tensor | tuple[torch.Tensor, torch.Tensor], target: torch.Tensor, aux_weight: float,
             ignore_index: int) -> torch.Tensor:
    """Cross-entropy (pixels labelled ``ignore_index`` left out) of the logits, upsampled to the labels' size, plus
    ``aux_weight`` × that of the auxiliary head's."""
    logits, aux = outputs if isinstance(outputs, tuple) else (outputs, None)
    size = target.shape[-2:]
    loss = F.cross_entropy(F.interpolate(logits, size=size, mode="bilinear", align_corners=False), target,
                           ignore_index=ignore_index)
    if aux is not None:  # at aux_weight 0 too: DDP needs a gradient (zeros) for every parameter of the aux head
        up = F.interpolate(aux, size=size, mode="bilinear", align_corners=False)
        loss = loss + aux_weight * F.cross_entropy(up, target, ignore_index=ignore_index)
    return loss
