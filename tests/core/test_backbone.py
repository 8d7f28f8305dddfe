"""ropim.core.backbone: the vit and beit encoders, the hand-written forward, and the BEiT-style classifier."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from timm.models.beit import RelativePositionBias
from timm.optim import create_optimizer_v2
from torch.nn import functional as F

from ropim.core.backbone import (
    backbone_of,
    build_classifier,
    create_encoder,
    encode_patch_embeddings,
    encoder_spec,
    no_weight_decay,
)
from ropim.core.config import ARCHS, BACKBONES, WIDTHS
from ropim.core.relpos import resize_rel_pos_bias_table
from ropim.errors import ConfigError

TINY = dict(img_size=32, patch_size=4, depth=2)  # an 8x8 grid: 64 tokens


def spec(backbone: str, arch: str = "vit_tiny_patch16_224", **kw) -> tuple[str, dict]:
    return encoder_spec(backbone, arch, **{**TINY, **kw})


def randomized(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with every parameter perturbed, so zero-initialised ones (bias tables, q/v biases) matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval()


def imgs(n: int = 2, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def test_beit_is_the_papers_backbone():
    enc = create_encoder(*spec("beit", drop_path_rate=0.1))
    assert enc.pos_embed is None
    shared = [m for m in enc.modules() if isinstance(m, RelativePositionBias)]
    assert len(shared) == 1 and shared[0] is enc.rel_pos_bias
    assert enc.rel_pos_bias.relative_position_bias_table.shape == (15 * 15 + 3, 3)
    for blk in enc.blocks:
        assert blk.attn.relative_position_bias_table is None
        assert blk.attn.q_bias is not None and blk.attn.v_bias is not None
        assert torch.equal(blk.gamma_1, torch.full((192,), 0.1)) and torch.equal(blk.gamma_2, torch.full((192,), 0.1))
        assert blk.norm1.eps == 1e-6
    assert enc.norm.eps == 1e-6
    assert enc.blocks[-1].drop_path1.drop_prob == pytest.approx(0.1)
    assert enc(imgs()).shape == (2, 192)  # num_classes=0: pooled features
    assert len(create_encoder(*spec("beit", depth=None, img_size=16)).blocks) == 12


@pytest.mark.parametrize("arch", ARCHS)
def test_beit_widths(arch):
    enc = create_encoder(*spec("beit", arch, depth=1))
    assert (enc.embed_dim, enc.blocks[0].attn.num_heads) == WIDTHS[arch]


def test_vit_is_timms_vision_transformer():
    name, kwargs = spec("vit")
    assert name == "vit_tiny_patch16_224"
    enc = create_encoder(name, kwargs)
    assert isinstance(enc, timm.models.VisionTransformer)
    assert enc.pos_embed.shape == (1, 1 + 64, 192)
    assert not hasattr(enc.blocks[0], "gamma_1") and isinstance(enc.blocks[0].ls1, torch.nn.Identity)


@pytest.mark.parametrize("backbone", BACKBONES)
def test_hand_written_forward_is_timms(backbone):
    enc = randomized(create_encoder(*spec(backbone)))
    x = imgs()
    with torch.no_grad():
        ours = encode_patch_embeddings(enc, enc.patch_embed(x))
        theirs = enc.forward_features(x)[:, enc.num_prefix_tokens:]
    assert ours.shape == (2, 64, 192)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    enc.set_grad_checkpointing(True)  # same numbers through checkpointed blocks
    torch.testing.assert_close(encode_patch_embeddings(enc, enc.patch_embed(x)), ours, rtol=1e-5, atol=1e-6)


def test_vit_forward_handles_no_embed_class_and_registers():
    name, kwargs = spec("vit")
    enc = randomized(create_encoder(name, kwargs, no_embed_class=True, reg_tokens=2))
    x = imgs()
    with torch.no_grad():
        ours = encode_patch_embeddings(enc, enc.patch_embed(x))
        theirs = enc.forward_features(x)[:, enc.num_prefix_tokens:]
    assert enc.num_prefix_tokens == 3 and ours.shape == (2, 64, 192)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backbone", BACKBONES)
def test_spec_rebuilds_the_encoder_with_plain_timm(backbone):
    name, kwargs = spec(backbone, in_chans=1, drop_path_rate=0.1)
    enc = randomized(create_encoder(name, kwargs))
    stored = json.loads(json.dumps({"arch": name, "timm_kwargs": kwargs}))  # what config.json keeps
    rebuilt = timm.create_model(stored["arch"], pretrained=False, **stored["timm_kwargs"]).eval()
    assert list(rebuilt.state_dict()) == list(enc.state_dict())
    rebuilt.load_state_dict(enc.state_dict())
    x = torch.randn(2, 1, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(x), enc(x))
    assert backbone_of(name) == backbone


def test_no_weight_decay_names():
    beit = create_encoder(*spec("beit"))
    assert "pos_embed" in beit.no_weight_decay()  # timm lists it although the model has none
    assert no_weight_decay(beit) == {"cls_token", "rel_pos_bias.relative_position_bias_table"}
    assert no_weight_decay(create_encoder(*spec("vit"))) == {"cls_token", "pos_embed"}
    clf = build_classifier(*spec("beit"), None, num_classes=5).model
    assert no_weight_decay(clf) == {"cls_token"} | {f"blocks.{i}.attn.relative_position_bias_table" for i in (0, 1)}


def test_beit_classifier_copies_the_shared_bias_into_every_block():
    name, kwargs = spec("beit", depth=3)
    enc = randomized(create_encoder(name, kwargs))
    clf = build_classifier(name, kwargs, enc.state_dict(), num_classes=0)
    model = clf.model.eval()
    assert model.rel_pos_bias is None
    shared = enc.rel_pos_bias.relative_position_bias_table
    for blk in model.blocks:
        assert torch.equal(blk.attn.relative_position_bias_table, shared)
        assert torch.equal(blk.attn.relative_position_index, enc.rel_pos_bias.relative_position_index)
    assert "copied into each of the 3 blocks" in clf.summary() and "resampled" not in clf.summary()
    x = imgs()
    with torch.no_grad():  # per-block copies compute what the shared bias did
        torch.testing.assert_close(model(x), enc(x), rtol=1e-5, atol=1e-6)
    assert clf.kwargs["use_rel_pos_bias"] and not clf.kwargs["use_shared_rel_pos_bias"]
    rebuilt = timm.create_model(clf.name, pretrained=False, **json.loads(json.dumps(clf.kwargs)))
    assert list(rebuilt.state_dict()) == list(model.state_dict())


def test_beit_classifier_resamples_the_bias_table_at_a_new_resolution():
    name, kwargs = spec("beit")
    enc = randomized(create_encoder(name, kwargs))
    clf = build_classifier(name, kwargs, enc.state_dict(), num_classes=7, img_size=48, drop_path=0.1)
    model = clf.model.eval()
    shared = enc.rel_pos_bias.relative_position_bias_table  # (15² + 3, heads) on the 8x8 grid
    table = model.blocks[1].attn.relative_position_bias_table
    assert table.shape == (23 * 23 + 3, 3)  # 12x12 grid
    torch.testing.assert_close(table, resize_rel_pos_bias_table(shared, (8, 8), (12, 12)))  # BEiT's way
    near_old = shared[:-3].reshape(15, 15, 3)[6:9, 6:9]  # offsets −1, 0, 1 on each axis
    torch.testing.assert_close(table[:-3].reshape(23, 23, 3)[10:13, 10:13], near_old, rtol=0, atol=1e-5)
    assert torch.equal(table[-3:], shared[-3:])
    assert torch.equal(model.blocks[0].attn.relative_position_bias_table, table)
    assert model.blocks[0].attn.relative_position_index.shape == (145, 145)
    assert "8x8 to a 12x12 grid" in clf.summary() and "copied" in clf.summary()
    with torch.no_grad():
        assert model(imgs(size=48)).shape == (2, 7)


def test_beit_fine_tune_head_pools_into_a_fresh_norm_as_the_official_code():
    """The official fine-tune (USE_MEAN_POOLING): the encoder's final norm dropped, the patch tokens' mean into a
    fresh LayerNorm, then the head; pooled features (no head: kNN, probe, segmentation) keep the encoder's norm."""
    name, kwargs = spec("beit")
    enc = randomized(create_encoder(name, kwargs))
    clf = build_classifier(name, kwargs, enc.state_dict(), num_classes=5)
    model = clf.model.eval()
    assert isinstance(model.norm, torch.nn.Identity) and clf.kwargs["use_fc_norm"]
    assert torch.equal(model.fc_norm.weight, torch.ones(192)) and torch.equal(model.fc_norm.bias, torch.zeros(192))
    assert "fresh LayerNorm (fc_norm)" in clf.summary()
    with torch.no_grad():
        tokens = model.forward_features(imgs())
        torch.testing.assert_close(model.forward_head(tokens, pre_logits=True), model.fc_norm(tokens[:, 1:].mean(1)))
        unnormed = enc.forward_intermediates(imgs(), norm=False, intermediates_only=True, output_fmt="NLC")[-1]
        torch.testing.assert_close(tokens[:, 1:], unnormed, rtol=1e-5, atol=1e-6)  # the blocks' own output
    features = build_classifier(name, kwargs, enc.state_dict(), num_classes=0)
    assert not features.kwargs["use_fc_norm"] and torch.equal(features.model.norm.weight, enc.norm.weight)


def test_vit_classifier_resamples_the_position_embedding():
    name, kwargs = spec("vit")
    enc = randomized(create_encoder(name, kwargs))
    same = build_classifier(name, kwargs, enc.state_dict(), num_classes=0).model.eval()
    with torch.no_grad():
        torch.testing.assert_close(same(imgs()), enc(imgs()))
    clf = build_classifier(name, kwargs, enc.state_dict(), num_classes=4, img_size=48)
    assert clf.model.pos_embed.shape == (1, 1 + 144, 192)
    assert torch.equal(clf.model.pos_embed[:, 0], enc.pos_embed[:, 0])  # cls entry kept
    assert "8x8 to a 12x12 grid" in clf.summary()
    with torch.no_grad():
        assert clf.model.eval()(imgs(size=48)).shape == (2, 4)


def test_random_init_classifier():
    clf = build_classifier(*spec("beit"), None, num_classes=3, img_size=48)
    assert "random init" in clf.summary()
    assert clf.model.blocks[0].attn.relative_position_bias_table.shape == (23 * 23 + 3, 3)


def test_layer_decay_over_beit_blocks():
    clf = build_classifier(*spec("beit", depth=4), None, num_classes=5).model
    opt = create_optimizer_v2(clf, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    params = dict(clf.named_parameters())

    def scale(name: str) -> float:
        return group_of[id(params[name])]["lr_scale"]

    blocks = [scale(f"blocks.{i}.attn.qkv.weight") for i in range(4)]
    assert blocks == sorted(blocks) and len(set(blocks)) == 4
    assert scale("cls_token") < blocks[0] < blocks[-1] < scale("head.weight") == 1.0
    assert scale("blocks.2.attn.relative_position_bias_table") == blocks[2]
    assert group_of[id(params["blocks.2.attn.relative_position_bias_table"])]["weight_decay"] == 0.0
    assert group_of[id(params["blocks.2.attn.qkv.weight"])]["weight_decay"] == 0.05


@pytest.mark.parametrize(
    ("backbone", "arch", "bad"),
    [("swin", "vit_tiny_patch16_224", "'swin'"), ("beit", "vit_huge_patch14_224", "'vit_huge_patch14_224'")],
)
def test_bad_names_raise_config_error(backbone, arch, bad):
    with pytest.raises(ConfigError, match=bad) as err:
        encoder_spec(backbone, arch, img_size=32, patch_size=4)
    assert ("vit, beit" if backbone == "swin" else ", ".join(ARCHS)) in str(err.value)


def test_bad_sizes_and_models_raise_config_error():
    with pytest.raises(ConfigError, match="patch size must divide"):
        encoder_spec("beit", "vit_tiny_patch16_224", img_size=30, patch_size=4)
    with pytest.raises(ConfigError, match="resnet50"):
        build_classifier("resnet50", {"img_size": 32, "patch_size": 4}, None, num_classes=2)


def test_load_weights_names_what_does_not_fit_in_one_line():
    import pytest

    from ropim.core.backbone import create_encoder, encoder_spec, load_weights
    from ropim.errors import ConfigError

    tiny = create_encoder(*encoder_spec("vit", "vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1))
    small = create_encoder(*encoder_spec("vit", "vit_small_patch16_224", img_size=32, patch_size=4, depth=1))
    with pytest.raises(ConfigError) as err:
        load_weights(small, tiny.state_dict(), "encoder X")
    message = str(err.value)
    assert message.startswith("encoder X: the weights do not fit the VisionTransformer") and "\n" not in message
    assert "18 of another shape, e.g. cls_token [1, 1, 192] vs [1, 1, 384]" in message
    state = dict(tiny.state_dict())
    state["extra.weight"] = state.pop("norm.weight")
    with pytest.raises(ConfigError, match=r"1 missing, e.g. norm.weight; 1 unexpected, e.g. extra.weight"):
        load_weights(tiny, state, "encoder X")
    clone = create_encoder(*encoder_spec("vit", "vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1))
    load_weights(clone, tiny.state_dict(), "encoder X")
    assert all(torch.equal(a, b) for a, b in zip(clone.state_dict().values(), tiny.state_dict().values(), strict=True))


def test_beit_on_cpu_runs_the_unfused_attention_with_timms_numbers(monkeypatch):
    """On CPU the beit blocks skip F.scaled_dot_product_attention (with a learnable bias it falls back to torch's
    slow math kernel) and give timm's numbers: fused timm in fp32 to float tolerance, forward and gradients (through
    checkpointed blocks too); timm's own unfused path bit for bit under bf16 autocast, drop path included."""
    enc = randomized(create_encoder(*spec("beit", drop_path_rate=0.2))).train()
    x = enc.patch_embed(imgs()).detach()

    def run(fn, autocast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        enc.zero_grad(set_to_none=True)
        torch.manual_seed(3)  # drop path draws
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = fn()
        out.float().square().mean().backward()
        return out, [p.grad for p in enc.parameters()]

    def timm_blocks() -> torch.Tensor:  # timm's own blocks with the shared bias, as forward_features runs them
        bias, h = enc.rel_pos_bias(), torch.cat([enc.cls_token.expand(2, -1, -1), x], dim=1)
        for blk in enc.blocks:
            h = blk(h, shared_rel_pos_bias=bias)
        return enc.norm(h)[:, 1:]

    fused, fused_grads = run(timm_blocks, autocast=False)
    with monkeypatch.context() as m:
        m.setattr(F, "scaled_dot_product_attention", None)  # any call would fail
        ours, grads = run(lambda: encode_patch_embeddings(enc, x), autocast=False)
        ours_bf16, grads_bf16 = run(lambda: encode_patch_embeddings(enc, x), autocast=True)
        enc.set_grad_checkpointing(True)  # the same block, recomputed in the backward
        ckpt, ckpt_grads = run(lambda: encode_patch_embeddings(enc, x), autocast=False)
        enc.set_grad_checkpointing(False)
    torch.testing.assert_close(ours, fused, rtol=1e-5, atol=1e-6)
    for g, ref in zip(grads, fused_grads, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
    assert torch.equal(ckpt, ours) and all(g is ref is None or torch.equal(g, ref)
                                           for g, ref in zip(ckpt_grads, grads, strict=True))
    for blk in enc.blocks:
        blk.attn.fused_attn = False
    unfused_bf16, unfused_grads = run(timm_blocks, autocast=True)
    assert not torch.equal(ours_bf16, ours) and torch.equal(ours_bf16, unfused_bf16)  # autocast was on
    assert all(g is ref is None or torch.equal(g, ref) for g, ref in zip(grads_bf16, unfused_grads, strict=True))
