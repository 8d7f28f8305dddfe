"""Tests for the ROPIM model (the paper's Eq. 3–6) on a tiny ViT: 32×32 images, patch 4, depth 2."""

from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
from support import gen
from support import make_model as make_cfg_model

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM, encoder_spec, patchify, unpatchify
from ropim.core.sketch import draw_sketch

CFG = ModelConfig(img_size=32, patch_size=4, depth=2, drop_path_rate=0.0)  # no stochastic depth: losses repeat
P, G, N = 4, 8, 64  # patch size, grid side, tokens
B = 3


def make_model(**changes) -> ROPIM:
    return make_cfg_model(CFG, **changes)


@pytest.fixture(scope="module")
def model() -> ROPIM:
    return make_model()


@pytest.fixture(scope="module")
def imgs() -> torch.Tensor:
    return torch.randn(B, 3, 32, 32, generator=gen(1))


@pytest.fixture(scope="module")
def sketch():
    return draw_sketch(B, N, CFG.rho, generator=gen(2))


# ---------------------------------------------------------------- loss


@pytest.mark.parametrize("backbone", ["vit", "beit"])
@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_loss_is_zero_for_perfect_prediction_and_invariant_inside_range_of_pi(imgs, sketch, loss, backbone):
    m = make_model(loss=loss, backbone=backbone)
    x = patchify(imgs, P)
    assert float(m.loss(imgs, x, sketch)) <= 1e-6

    pred = torch.randn(B, N, P * P * 3, generator=gen(3))
    base = m.loss(imgs, pred, sketch)
    assert float(base) > 0.1
    z = 5 * torch.randn(B, N, P * P * 3, generator=gen(4))
    moved = m.loss(imgs, pred + sketch.project(z), sketch)
    torch.testing.assert_close(moved, base, rtol=1e-5, atol=1e-6)
    # ...but a move with a component outside Π's range does change it
    assert abs(float(m.loss(imgs, pred + sketch.complement(z), sketch)) - float(base)) > 0.1

    # matches the dense formula mean |(I − Π)(X − X̃)| (or its square)
    q = torch.eye(N, dtype=torch.float64) - sketch.dense().double()
    resid = q @ (x - pred).double()
    ref = resid.abs().mean() if loss == "l1" else resid.pow(2).mean()
    torch.testing.assert_close(base.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_loss_without_corruption_is_plain_mean_error(imgs, loss):
    m = make_model(corruption="none", loss=loss)
    assert m.draw_sketch(B, gen()) is None
    pred = torch.randn(B, N, P * P * 3, generator=gen(5))
    diff = patchify(imgs, P) - pred
    ref = diff.abs().mean() if loss == "l1" else diff.pow(2).mean()
    torch.testing.assert_close(m.loss(imgs, pred, None), ref)
    loss_value, out, sk = m(imgs)
    assert sk is None
    torch.testing.assert_close(loss_value, m.loss(imgs, out, None))


# ---------------------------------------------------------------- patchify


@pytest.mark.parametrize("channels", [3, 1])
def test_patchify_round_trip(channels):
    x = torch.randn(2, channels, 32, 32, generator=gen(6))
    tokens = patchify(x, P)
    assert tokens.shape == (2, N, P * P * channels)
    torch.testing.assert_close(unpatchify(tokens, P, channels), x, rtol=0, atol=0)
    y = torch.randn(2, 16, 8 * 8 * channels, generator=gen(7))
    torch.testing.assert_close(patchify(unpatchify(y, 8, channels), 8), y, rtol=0, atol=0)


def test_patchify_token_order_is_row_major_patches(imgs):
    tokens = patchify(imgs, P)
    for k in range(N):
        r, c = k // G, k % G
        patch = imgs[:, :, r * P : (r + 1) * P, c * P : (c + 1) * P]  # (B, C, p, p)
        torch.testing.assert_close(tokens[:, k], patch.permute(0, 2, 3, 1).reshape(B, -1), rtol=0, atol=0)


def test_patchify_order_matches_encoder_patch_embed(model, imgs):
    """patch_embed(imgs)[:, k] is the linear map of patchify(imgs)[:, k] (same token order)."""
    proj = model.encoder.patch_embed.proj  # Conv2d(C, D, p, stride p)
    w = proj.weight.permute(0, 2, 3, 1).reshape(proj.out_channels, -1)  # pixels as (p, p, C)
    with torch.no_grad():
        phi = model.encoder.patch_embed(imgs)
        ref = patchify(imgs, P) @ w.T + proj.bias
    assert phi.shape == (B, N, model.encoder.embed_dim)
    torch.testing.assert_close(phi, ref, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- where Π is applied


def manual_reconstruct(m: ROPIM, imgs: torch.Tensor, pi: torch.Tensor | None, late: bool = False) -> torch.Tensor:
    """Eq. 3–6 by hand: Φ = patch_embed; Φ' = ΠΦ (dense); cat cls; + pos (vit); blocks; norm; drop cls; W*.
    ``late``: Π applied after the position embedding instead (wrong, for comparison)."""
    enc = m.encoder
    phi = enc.patch_embed(imgs)
    if pi is not None and not late:
        phi = torch.bmm(pi, phi)
    x = torch.cat([enc.cls_token.expand(imgs.shape[0], -1, -1), phi], dim=1)
    if enc.pos_embed is not None:
        x = x + enc.pos_embed
    if pi is not None and late:
        x = torch.cat([x[:, :1], torch.bmm(pi, x[:, 1:])], dim=1)
    bias = {"shared_rel_pos_bias": enc.rel_pos_bias()} if m.cfg.backbone == "beit" else {}
    for blk in enc.blocks:
        x = blk(x, **bias)
    x = enc.norm(x)
    return m.decoder(x[:, 1:])


@torch.no_grad()
@pytest.mark.parametrize("backbone", ["vit", "beit"])
def test_rop_is_applied_to_patch_embeddings_before_cls_and_pos(backbone, imgs, sketch):
    model = make_model(backbone=backbone)
    assert model.encoder.num_prefix_tokens == 1
    pred = model.reconstruct(imgs, sketch)
    pi = sketch.dense()
    torch.testing.assert_close(pred, manual_reconstruct(model, imgs, pi), rtol=1e-4, atol=1e-4)

    # Π really changes the input, and applying it after the position embedding would be different
    plain = model.reconstruct(imgs, None)
    torch.testing.assert_close(plain, manual_reconstruct(model, imgs, None), rtol=1e-4, atol=1e-4)
    assert (pred - plain).abs().max() > 1e-2
    if backbone == "vit":
        assert (pred - manual_reconstruct(model, imgs, pi, late=True)).abs().max() > 1e-2
    enc = model.encoder

    # the encoder path without Π is timm's forward_features
    torch.testing.assert_close(plain, model.decoder(enc.forward_features(imgs)[:, 1:]), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- training step


@pytest.mark.parametrize("backbone", ["vit", "beit"])
def test_forward_backward(backbone):
    m = make_model(backbone=backbone).train()
    imgs = torch.randn(2, 3, 32, 32, generator=gen(8))
    loss, pred, sk = m(imgs, generator=gen(9))
    assert pred.shape == (2, N, P * P * 3)
    assert loss.ndim == 0 and torch.isfinite(loss) and float(loss.detach()) > 0
    assert sk is not None and sk.h.shape == (2, N) and sk.n_buckets == 10  # ceil(64/7)
    loss.backward()
    enc = m.encoder
    for name, param in [
        ("patch_embed", enc.patch_embed.proj.weight),
        ("cls_token", enc.cls_token),
        ("pos_embed" if backbone == "vit" else "rel_pos_bias", enc.pos_embed if backbone == "vit" else
         enc.rel_pos_bias.relative_position_bias_table),
        ("block0", enc.blocks[0].attn.qkv.weight),
        ("block1", enc.blocks[1].mlp.fc2.weight),
        ("norm", enc.norm.weight),
        ("decoder", m.decoder.weight),
    ]:
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    # reproducible from the generator seed
    with torch.no_grad():
        again, _, sk2 = m(imgs, generator=gen(9))
    assert torch.equal(sk.h, sk2.h) and torch.equal(sk.s, sk2.s)
    torch.testing.assert_close(again, loss.detach())


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(rho=0.0), "rho"),
        (dict(rho=1.5), "rho"),
        (dict(img_size=30, patch_size=4), "patch_size"),
        (dict(arch="resnet50"), "arch"),
        (dict(corruption="blur"), "corruption"),
        (dict(loss="l3"), "loss"),
        (dict(init="official"), r"model.init='official'.*needs backbone: beit"),
        (dict(init="xavier", backbone="beit"), "model.init='xavier'"),
        (dict(literal_scale="yes"), "model.literal_scale='yes'"),
    ],
)
def test_bad_config_raises_value_error(changes, match):
    cfg = dataclasses.replace(CFG, **changes)
    with pytest.raises(ValueError, match=match):
        cfg.validate()
    with pytest.raises(ValueError, match=match):
        ROPIM(cfg)


# ---------------------------------------------------------------- export


@torch.no_grad()
def test_encoder_exports_to_plain_timm_model(model, imgs):
    name, kwargs = encoder_spec(CFG)
    rebuilt = timm.create_model(name, pretrained=False, **kwargs)
    rebuilt.load_state_dict(model.encoder.state_dict(), strict=True)
    rebuilt.eval()
    enc = model.encoder.eval()
    feats = rebuilt.forward_features(imgs)
    torch.testing.assert_close(feats, enc.forward_features(imgs), rtol=0, atol=0)
    pooled = rebuilt.forward_head(feats, pre_logits=True)
    torch.testing.assert_close(pooled, enc.forward_head(enc.forward_features(imgs), pre_logits=True), rtol=0, atol=0)
    # avg pool over patch tokens of the normed features, no extra fc_norm, no classifier
    assert pooled.shape == (B, enc.embed_dim)
    torch.testing.assert_close(pooled, feats[:, 1:].mean(1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rebuilt(imgs), pooled, rtol=0, atol=0)


def test_beit_model_is_the_papers_backbone():
    """No absolute position embedding, one relative position bias shared by all blocks, layer scale 0.1 at init,
    and the tables kept out of weight decay."""
    m = make_model(backbone="beit")
    enc = m.encoder
    assert enc.pos_embed is None
    shared = [mod for mod in enc.modules() if type(mod).__name__ == "RelativePositionBias"]
    assert shared == [enc.rel_pos_bias]
    assert all(blk.attn.relative_position_bias_table is None for blk in enc.blocks)
    for blk in enc.blocks:
        assert torch.all(blk.gamma_1 == 0.1) and torch.all(blk.gamma_2 == 0.1)
    assert "encoder.rel_pos_bias.relative_position_bias_table" in m.no_weight_decay()
