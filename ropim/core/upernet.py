"""UperNet on a plain ViT, the semantic-segmentation transfer protocol of BEiT / MAE / SimMIM (mmseg), that the
ROPIM paper's Table 3 follows:

    x (B, 3, H, W)
      → ViT blocks (timm ``forward_intermediates``): the outputs of 4 evenly spaced blocks (4, 6, 8, 12 of 12),
        tokens reshaped to maps (B, D, H/p, W/p)                                   p = patch size (16: 1/16)
      → pyramid: ×4 up (2 transposed convs), ×2 up (1 transposed conv), identity, ÷2 (max-pool)
        (B, D, 4H/p, 4W/p) (B, D, 2H/p, 2W/p) (B, D, H/p, W/p) (B, D, H/2p, W/2p)     1/4 1/8 1/16 1/32 at p=16
      → UperNet decoder (segmentation_models_pytorch's ``UPerNetDecoder``: PPM (1, 2, 3, 6) on the coarsest level +
        FPN top-down over the others, fused at the finest level)                 (B, C, 4H/p, 4W/p)
      → dropout 0.1 + 1×1 conv                                                   (B, K, 4H/p, 4W/p)
    and, in training, an auxiliary FCN head (3×3 conv, BN, ReLU, dropout, 1×1 conv) on the third level (1/16),
    whose loss the task weights by 0.4.

Logits come out at the decoder's resolution; the loss and the predictions upsample them to the label's size.
Nothing here imports ropim: MLflow ships this file beside a registered ``ropim-segmenter`` (``code_paths``), so the
model loads with torch, timm and segmentation_models_pytorch alone (``build_segmenter(config)``).
"""

from __future__ import annotations

import timm
import torch
from segmentation_models_pytorch.decoders.upernet.decoder import UPerNetDecoder
from torch import nn


def block_indices(depth: int) -> list[int]:
    """The 4 evenly spaced blocks whose outputs feed the pyramid: [3, 5, 7, 11] of 12 (BEiT/MAE's out_indices);
    shallower encoders repeat a block where they have fewer than 4 (6 blocks: [1, 2, 3, 5]; 1 block: [0, 0, 0, 0])."""
    return [max(0, round(depth * f) - 1) for f in (1 / 3, 1 / 2, 2 / 3, 1.0)]


class UperNetViT(nn.Module):
    """A timm ViT encoder (VisionTransformer or Beit, built at the crop size) + feature pyramid + UperNet + aux head."""

    def __init__(self, encoder: nn.Module, num_classes: int, channels: int = 768, aux_channels: int = 256,
                 dropout: float = 0.1, indices: list[int] | None = None) -> None:
        super().__init__()
        depth, dim = len(encoder.blocks), encoder.embed_dim
        self.indices = list(indices or block_indices(depth))
        self.taken = sorted(set(self.indices))  # the blocks forward_intermediates returns, in order
        encoder.prune_intermediate_layers(self.taken, prune_norm=True, prune_head=True)  # nothing unused stays
        self.encoder = encoder
        self.num_classes = num_classes
        # --------------------------------------------------------------------------------------------------------
        # pyramid from the 1/p maps (D channels throughout, as BEiT's fpn1..fpn4)
        self.up4 = nn.Sequential(nn.ConvTranspose2d(dim, dim, 2, stride=2), nn.BatchNorm2d(dim), nn.GELU(),
                                 nn.ConvTranspose2d(dim, dim, 2, stride=2))
        self.up2 = nn.ConvTranspose2d(dim, dim, 2, stride=2)
        self.same = nn.Identity()
        self.down2 = nn.MaxPool2d(2)
        # --------------------------------------------------------------------------------------------------------
        # UperNet decoder: its inputs are [1, 1/2, 1/4, 1/8, 1/16, 1/32] of a CNN; it reads the last four only
        self.decoder = UPerNetDecoder(encoder_channels=[dim] * 6, encoder_depth=5, decoder_channels=channels)
        self.classifier = nn.Sequential(nn.Dropout2d(dropout), nn.Conv2d(channels, num_classes, 1))
        self.aux_head = nn.Sequential(nn.Conv2d(dim, aux_channels, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(aux_channels), nn.ReLU(inplace=True), nn.Dropout2d(dropout),
                                      nn.Conv2d(aux_channels, num_classes, 1))

    def pyramid(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The 4-level pyramid of images x (B, 3, H, W): maps at 4/p, 2/p, 1/p and 1/(2p) of the input, D channels."""
        taken = self.encoder.forward_intermediates(x, indices=self.taken, intermediates_only=True)  # [(B, D, h, w)]
        by_block = dict(zip(self.taken, taken, strict=True))
        maps = [by_block[i] for i in self.indices]  # 4 × (B, D, h, w), h = H/p
        return [self.up4(maps[0]),  # (B, D, 4h, 4w)
                self.up2(maps[1]),  # (B, D, 2h, 2w)
                self.same(maps[2]),  # (B, D, h, w)
                self.down2(maps[3])]  # (B, D, h/2, w/2)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Class logits (B, K, 4h, 4w) of images x (B, 3, H, W); in training also the aux head's (B, K, h, w)."""
        levels = self.pyramid(x)
        fused = self.decoder([None, None, *levels])  # (B, C, 4h, 4w); the 1/1 and 1/2 slots are skipped
        logits = self.classifier(fused)  # (B, K, 4h, 4w)
        if self.training:
            return logits, self.aux_head(levels[2])  # (B, K, h, w)
        return logits

    def group_matcher(self, coarse: bool = False) -> dict:
        """Layer groups for layer-wise lr decay (timm's optimizer factory): the encoder's embeddings, then one group
        per block; the pyramid, decoder and heads (unmatched) form the last group, at the full learning rate."""
        return {"stem": r"^encoder\.(?:cls_token|reg_token|pos_embed|patch_embed|norm_pre|rel_pos_bias)",
                "blocks": [(r"^encoder\.blocks\.(\d+)", None)]}

    def no_weight_decay(self) -> set[str]:
        """The encoder's tokens, position embedding and relative position bias tables (biases and norms are 1-d)."""
        listed = self.encoder.no_weight_decay() if hasattr(self.encoder, "no_weight_decay") else set()
        names = {n for n, _ in self.named_parameters()}
        tables = {n for n in names if n.endswith("relative_position_bias_table")}
        return ({f"encoder.{n}" for n in listed} | tables) & names


def build_segmenter(config: dict) -> UperNetViT:
    """The segmenter a registered config describes (random weights): ``arch`` + ``timm_kwargs`` build the encoder at
    the crop size, the rest the heads. ``load_state_dict`` of the registered weights follows."""
    encoder = timm.create_model(config["arch"], pretrained=False, **config["timm_kwargs"])
    return UperNetViT(encoder, config["num_classes"], config["channels"], config["aux_channels"],
                      config.get("dropout", 0.1), config["indices"])
