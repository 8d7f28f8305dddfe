"""UperNet on a ViT: the blocks it reads and the 4-level pyramid at ViT-T and ViT-B depths and widths, the
BEiT/SimMIM treatment of a `beit` encoder's shared relative position bias (copied per block, table resampled), the
`vit` position embedding resampled, and layer-wise lr decay over the encoder only."""

from __future__ import annotations

import pytest
import torch
from timm.optim import create_optimizer_v2

from ropim.core.backbone import create_encoder, encoder_spec
from ropim.core.relpos import resize_rel_pos_bias_table
from ropim.core.segmenter import seg_loss, segmenter_from_encoder
from ropim.core.upernet import UperNetViT, block_indices, build_segmenter


def test_block_indices_are_beits_out_indices_at_12_blocks():
    assert block_indices(12) == [3, 5, 7, 11]  # blocks 4, 6, 8, 12
    assert block_indices(6) == [1, 2, 3, 5]
    assert block_indices(1) == [0, 0, 0, 0]


@pytest.mark.parametrize("arch,dim", [("vit_tiny_patch16_224", 192), ("vit_base_patch16_224", 768)])
@pytest.mark.parametrize("backbone", ["vit", "beit"])
def test_pyramid_shapes_at_vit_t_and_vit_b(arch, dim, backbone):
    name, kwargs = encoder_spec(backbone, arch, img_size=32, patch_size=16, depth=12)
    with torch.device("meta"):  # shapes only: no memory, no time for ViT-B's 86 M weights
        model = UperNetViT(create_encoder(name, kwargs | {"img_size": 64}), 5, channels=16, aux_channels=8).eval()
        x = torch.empty(2, 3, 64, 64)  # a 4x4 grid of 16-px patches
        levels = model.pyramid(x)
        assert model.indices == [3, 5, 7, 11] and len(model.encoder.blocks) == 12
        assert [tuple(t.shape) for t in levels] == [(2, dim, 16, 16), (2, dim, 8, 8), (2, dim, 4, 4), (2, dim, 2, 2)]
        assert model(x).shape == (2, 5, 16, 16)  # logits at 1/4 of the input
        logits, aux = model.train()(x)
        assert logits.shape == (2, 5, 16, 16) and aux.shape == (2, 5, 4, 4)


def test_pyramid_levels_are_the_chosen_blocks_outputs():
    name, kwargs = encoder_spec("vit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=6)
    model = segmenter_from_encoder(name, kwargs, None, 5, 32, channels=8, aux_channels=8).model.eval()
    x = torch.randn(2, 3, 32, 32)
    levels = model.pyramid(x)
    block4 = model.encoder.forward_intermediates(x, indices=[3], intermediates_only=True)[0]  # (2, 192, 4, 4)
    torch.testing.assert_close(levels[2], block4)  # the identity level: block 4 of 6
    torch.testing.assert_close(levels[3], torch.nn.functional.max_pool2d(
        model.encoder.forward_intermediates(x, indices=[5], intermediates_only=True)[0], 2))


def test_every_parameter_trains_and_the_unused_encoder_norm_is_gone():
    name, kwargs = encoder_spec("vit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=6)
    model = segmenter_from_encoder(name, kwargs, None, 3, 32, channels=8, aux_channels=8).model.train()
    logits, aux = model(torch.randn(2, 3, 32, 32))
    (logits.mean() + aux.mean()).backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []  # DDP needs no find_unused_parameters
    assert not any(n.startswith("encoder.norm.") for n, _ in model.named_parameters())


def test_an_aux_weight_of_0_still_gives_the_aux_head_a_gradient_for_ddp():
    """--aux_weight 0 on several workers: Ray's DDP (find_unused_parameters=False) needs a gradient for every
    parameter; the aux head's are zeros and the loss is the main head's alone (before: the second step raised)."""
    name, kwargs = encoder_spec("vit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=6)
    model = segmenter_from_encoder(name, kwargs, None, 3, 32, channels=8, aux_channels=8).model.train()
    outputs = model(torch.randn(2, 3, 32, 32))
    target = torch.randint(0, 3, (2, 32, 32))
    loss = seg_loss(outputs, target, 0.0, 255)
    torch.testing.assert_close(loss, seg_loss(outputs[0], target, 0.4, 255))  # the main head's loss alone
    loss.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert all(not p.grad.any() for n, p in model.named_parameters() if n.startswith("aux_head."))


def test_beit_shared_bias_is_copied_per_block_and_its_table_resampled():
    name, kwargs = encoder_spec("beit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)
    torch.manual_seed(0)
    encoder = create_encoder(name, kwargs)
    shared = encoder.state_dict()["rel_pos_bias.relative_position_bias_table"]  # (7*7 + 3, heads)
    with torch.no_grad():
        shared.normal_()  # distinct entries, so a copy or a resampling shows
    state = {**encoder.state_dict(), "rel_pos_bias.relative_position_bias_table": shared}
    same = segmenter_from_encoder(name, kwargs, state, 4, 32, channels=8, aux_channels=8)
    for blk in same.model.encoder.blocks:
        torch.testing.assert_close(blk.attn.relative_position_bias_table, shared)  # same 4x4 grid: a plain copy
    larger = segmenter_from_encoder(name, kwargs, state, 4, 64, channels=8, aux_channels=8)  # 8x8 grid
    expected = resize_rel_pos_bias_table(shared, (4, 4), (8, 8))  # BEiT's geometric offsets (tests/core/test_relpos)
    for blk in larger.model.encoder.blocks:
        table = blk.attn.relative_position_bias_table
        assert table.shape == (15 * 15 + 3, 3)
        torch.testing.assert_close(table, expected)
        torch.testing.assert_close(table[-3:], shared[-3:])  # the cls entries are kept
    assert any("relative position bias resampled from a 4x4 to a 8x8 grid" in a for a in larger.actions)
    assert any("copied into each of the 2 blocks" in a for a in larger.actions)


def test_vit_position_embedding_is_resampled_to_the_crop():
    name, kwargs = encoder_spec("vit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)
    encoder = create_encoder(name, kwargs)
    seg = segmenter_from_encoder(name, kwargs, encoder.state_dict(), 4, 64, channels=8, aux_channels=8)
    assert seg.model.encoder.pos_embed.shape == (1, 1 + 64, 192)
    torch.testing.assert_close(seg.model.encoder.blocks[0].attn.qkv.weight, encoder.blocks[0].attn.qkv.weight)


def test_layer_decay_scales_the_encoder_blocks_and_leaves_the_decoder_at_the_full_rate():
    name, kwargs = encoder_spec("beit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)
    model = segmenter_from_encoder(name, kwargs, None, 4, 32, channels=8, aux_channels=8).model
    opt = create_optimizer_v2(model, "adamw", lr=1.0, weight_decay=0.05, layer_decay=0.5)
    scale_of = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    scale = {n: scale_of[id(p)] for n, p in model.named_parameters()}
    assert scale["decoder.fusion_block.0.weight"] == scale["classifier.1.weight"] == 1.0
    assert scale["encoder.blocks.1.mlp.fc1.weight"] == 0.5
    assert scale["encoder.blocks.0.mlp.fc1.weight"] == 0.25
    assert scale["encoder.patch_embed.proj.weight"] == 0.125
    decay_of = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert decay_of[id(model.encoder.blocks[0].attn.relative_position_bias_table)] == 0.0
    assert decay_of[id(model.encoder.cls_token)] == 0.0


def test_registered_config_rebuilds_the_same_model():
    name, kwargs = encoder_spec("beit", "vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2)
    seg = segmenter_from_encoder(name, kwargs, create_encoder(name, kwargs).state_dict(), 4, 64, channels=8,
                                 aux_channels=8)
    again = build_segmenter(seg.config)
    again.load_state_dict(seg.model.state_dict())
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(again.eval()(x), seg.model.eval()(x))
