"""SimMIM masking in the ROPIM harness (a tiny ViT at 32×32): the share hidden, the loss, the mask token."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from support import gen
from support import make_model as make_cfg_model
from timm.optim import create_optimizer_v2

from ropim.core.config import ModelConfig, default_mask_unit
from ropim.core.masking import PatchMask, draw_mask
from ropim.core.model import ROPIM, patchify
from ropim.errors import ConfigError

CFG = ModelConfig(img_size=32, patch_size=4, depth=2, corruption="mask")
P, N, B = 4, 64, 3


def make_model(**changes) -> ROPIM:
    return make_cfg_model(CFG, **changes)


@pytest.fixture(scope="module")
def imgs() -> torch.Tensor:
    return torch.randn(B, 3, 32, 32, generator=gen(1))



# ---------------------------------------------------------------- the mask


@pytest.mark.parametrize(
    ("changes", "unit", "units", "masked"),
    [
        (dict(), 4, 64, 38),  # default unit at 32²/4: 32·32/224 ≈ 4.6 -> one patch; round(0.6·64) = 38
        (dict(mask_patch_size=8), 8, 16, 10),  # 2×2 patches per unit; round(0.6·16) = 10 units = 40 patches
        (dict(mask_patch_size=16, mask_ratio=0.5), 16, 4, 2),
        (dict(mask_ratio=0.75), 4, 64, 48),
    ],
)
def test_mask_hides_exactly_the_requested_share(changes, unit, units, masked):
    cfg = dataclasses.replace(CFG, **changes).validate()
    assert (cfg.mask_unit, cfg.n_mask_units, cfg.n_masked_units) == (unit, units, masked)
    m = ROPIM(cfg)
    mk = m.draw_corruption(5, gen(3))
    assert isinstance(mk, PatchMask)
    assert mk.units.shape == (5, units) and mk.mask.shape == (5, N)
    assert (mk.units.sum(1) == masked).all()
    per_unit = (unit // P) ** 2
    assert (mk.mask.sum(1) == masked * per_unit).all()
    # every masked patch lies in a masked unit: the unit grid upsampled is the patch grid
    side, g = 32 // unit, 32 // P
    up = mk.units.view(5, side, side).repeat_interleave(unit // P, 1).repeat_interleave(unit // P, 2)
    assert torch.equal(up.reshape(5, g * g), mk.mask)
    # reproducible from the generator, different across images and seeds
    again = m.draw_corruption(5, gen(3))
    assert torch.equal(again.mask, mk.mask)
    assert not torch.equal(m.draw_corruption(5, gen(4)).mask, mk.mask)
    assert len({tuple(r.tolist()) for r in mk.units}) > 1


def test_default_mask_unit_is_32px_at_224_scaled():
    assert default_mask_unit(224, 16) == 32 and ModelConfig().n_mask_units == 49 and ModelConfig().n_masked_units == 29
    assert default_mask_unit(32, 4) == 4 and default_mask_unit(64, 8) == 8 and default_mask_unit(32, 8) == 8
    for size, patch in [(240, 16), (96, 16), (192, 16), (128, 8)]:
        u = default_mask_unit(size, patch)
        assert u % patch == 0 and size % u == 0


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        (dict(mask_ratio=0.0), "mask_ratio"),
        (dict(mask_ratio=1.0), "mask_ratio"),
        (dict(mask_ratio=-0.2), "mask_ratio"),
        (dict(mask_ratio=1.5), "mask_ratio"),
        (dict(mask_ratio=0.001), "mask_ratio"),  # rounds to 0 masked units
        (dict(mask_patch_size=6), "mask_patch_size"),  # not a multiple of the patch size
        (dict(mask_patch_size=12), "mask_patch_size"),  # does not divide the image
    ],
)
def test_bad_mask_config_raises_config_error(changes, match):
    cfg = dataclasses.replace(CFG, **changes)
    with pytest.raises(ConfigError, match=match):
        cfg.validate()
    with pytest.raises(ConfigError, match=match):
        ROPIM(cfg)


# ---------------------------------------------------------------- the loss


@pytest.mark.parametrize("loss", ["l1", "l2"])
def test_mask_loss_ignores_visible_patches(imgs, loss):
    m = make_model(loss=loss)
    mk = m.draw_mask(B, gen(5))
    x = patchify(imgs, P)
    pred = torch.randn(B, N, P * P * 3, generator=gen(6))
    base = m.loss(imgs, pred, mk)
    # the mean over the elements of the masked patches only
    diff = (x - pred)[mk.mask]
    ref = diff.abs().mean() if loss == "l1" else diff.pow(2).mean()
    torch.testing.assert_close(base, ref)
    assert float(m.loss(imgs, x, mk)) == 0.0

    visible = (~mk.mask).unsqueeze(-1).float()
    noise = 10 * torch.randn(B, N, P * P * 3, generator=gen(7))
    assert torch.equal(m.loss(imgs, pred + noise * visible, mk), base)  # visible changes: loss unchanged
    assert abs(float(m.loss(imgs, pred + noise * (1 - visible), mk)) - float(base)) > 0.1  # masked: changed

    # and the gradient never reaches the predictions of visible patches
    p = pred.clone().requires_grad_(True)
    m.loss(imgs, p, mk).backward()
    assert p.grad[~mk.mask].abs().max() == 0 and p.grad[mk.mask].abs().sum() > 0


def test_mask_token_replaces_masked_embeddings_before_cls_and_pos(imgs):
    m = make_model()
    mk = m.draw_mask(B, gen(8))
    enc = m.encoder
    with torch.no_grad():
        phi = enc.patch_embed(imgs)
        phi = torch.where(mk.mask.unsqueeze(-1), m.mask_token.expand_as(phi), phi)
        x = torch.cat([enc.cls_token.expand(B, -1, -1), phi], dim=1) + enc.pos_embed
        ref = m.decoder(enc.norm(enc.blocks(x))[:, 1:])
        torch.testing.assert_close(m.reconstruct(imgs, mk), ref, rtol=1e-5, atol=1e-5)


def test_mask_training_step_and_export():
    m = make_model().train()
    loss, pred, mk = m(torch.randn(2, 3, 32, 32, generator=gen(9)), generator=gen(10))
    assert isinstance(mk, PatchMask) and pred.shape == (2, N, P * P * 3) and torch.isfinite(loss)
    loss.backward()
    assert m.mask_token.shape == (1, 1, m.encoder.embed_dim)
    assert m.mask_token.grad is not None and m.mask_token.grad.abs().sum() > 0
    assert m.encoder.patch_embed.proj.weight.grad.abs().sum() > 0
    # trunc-normal init (SimMIM: std .02), kept outside the exported encoder
    assert 0 < float(m.mask_token.detach().std()) < 0.05
    assert "mask_token" in m.state_dict() and not any("mask" in k for k in m.encoder.state_dict())
    # rop and none have no mask token at all (their state dicts are unchanged)
    assert "mask_token" not in make_model(corruption="rop").state_dict()


@pytest.mark.parametrize("corruption", ["rop", "mask", "none"])
def test_no_weight_decay_on_pos_cls_and_mask_token(corruption):
    m = make_model(corruption=corruption)
    names = m.no_weight_decay()
    params = dict(m.named_parameters())
    expected = {"encoder.pos_embed", "encoder.cls_token"} | ({"mask_token"} if corruption == "mask" else set())
    assert names == expected and names <= params.keys()
    opt = create_optimizer_v2(m, "adamw", lr=1e-3, weight_decay=0.05, betas=(0.9, 0.95))
    wd = {id(p): g["weight_decay"] for g in opt.param_groups for p in g["params"]}
    assert all(wd[id(params[n])] == 0.0 for n in expected)
    assert wd[id(params["encoder.blocks.0.attn.qkv.weight"])] == 0.05 and wd[id(params["decoder.weight"])] == 0.05
    assert len(wd) == len(params)


def test_switching_corruption_changes_nothing_else_in_the_run_config():
    from ropim.train.pretrain.config import PretrainConfig

    base = PretrainConfig()
    dicts = {}
    for c in ("rop", "mask", "none"):
        cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, corruption=c)).validate()
        d = cfg.to_dict()
        assert d["model"].pop("corruption") == c
        dicts[c] = d
    assert dicts["rop"] == dicts["mask"] == dicts["none"]
    # the models differ only by the mask token (same encoder and decoder, same init from the same seed)
    states = {}
    for c in ("rop", "mask", "none"):
        torch.manual_seed(0)
        states[c] = ROPIM(dataclasses.replace(base.model, corruption=c, depth=2)).state_dict()
    assert states["mask"].keys() - states["rop"].keys() == {"mask_token"}
    for k, v in states["rop"].items():
        assert torch.equal(v, states["none"][k]) and torch.equal(v, states["mask"][k]), k




def test_draw_mask_per_patch_unit_counts():
    mk = draw_mask(6, 32, 4, 4, 48, generator=gen(1))
    assert (mk.mask.sum(1) == 48).all() and torch.equal(mk.mask, mk.units)
