"""MoCo v3 as LGP-ROPIM trains it: the momentum schedule and update, the loss on cases worked out by hand, the keys
gathered across 2 processes (torch.distributed, gloo) giving the loss of the whole batch, LGP's parameter groups."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from gloo_worker import gathered_loss
from support import TINY_MODEL, on_two_ranks

from ropim.core.contrastive import contrastive_loss, momentum_at
from ropim.core.moco import MoCo, block_of, lgp_param_groups, moco_mlp
from ropim.core.model import create_encoder


def tiny_moco(depth: int = 3, **kwargs) -> MoCo:
    torch.manual_seed(0)
    return MoCo(create_encoder(dataclasses.replace(TINY_MODEL, depth=depth)), dim=8, mlp_dim=16, **kwargs)


def test_momentum_schedule_rises_from_m0_to_one_on_a_half_cosine():
    assert momentum_at(0, 100, 0.99) == pytest.approx(0.99)
    assert momentum_at(50, 100, 0.99) == pytest.approx(0.995)  # cos(π/2) = 0: halfway between m0 and 1
    assert momentum_at(25, 100, 0.99) == pytest.approx(1 - 0.01 * (math.cos(math.pi / 4) + 1) / 2)
    assert momentum_at(100, 100, 0.99) == pytest.approx(1.0)
    assert momentum_at(50, 100, 0.99, cosine=False) == 0.99


def test_momentum_update_is_one_ema_step_computed_by_hand():
    model = tiny_moco()
    with torch.no_grad():
        for p in model.online_params():
            p.fill_(1.0)
        for p in model.momentum_params():
            p.fill_(3.0)
    bn_mean = model.momentum_projector[1].running_mean.clone()
    model.update_momentum(0.9)
    for p in model.momentum_params():  # 0.9 · 3 + 0.1 · 1
        torch.testing.assert_close(p, torch.full_like(p, 2.8))
    assert all(bool((p == 1.0).all()) for p in model.online_params())  # the online branch is left alone
    torch.testing.assert_close(model.momentum_projector[1].running_mean, bn_mean)  # buffers are the branch's own
    assert not any(p.requires_grad for p in model.momentum_params())


def test_contrastive_loss_on_cases_worked_out_by_hand():
    tau = 0.5
    # orthogonal unit queries equal to their keys (scaled: the loss normalises): logits [[2, 0], [0, 2]]
    q, k = torch.tensor([[2.0, 0.0], [0.0, 3.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    by_hand = 2 * tau * math.log(1 + math.exp(-1 / tau))  # -log(e^2 / (e^2 + e^0)), times 2τ
    assert contrastive_loss(q, k, tau).item() == pytest.approx(by_hand, rel=1e-6)
    # query 2 halfway between both keys: equal logits, cross-entropy log 2
    tau = 0.2
    q = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    by_hand = 2 * tau * (math.log(1 + math.exp(-1 / tau)) + math.log(2)) / 2
    assert contrastive_loss(q, k, tau).item() == pytest.approx(by_hand, rel=1e-6)


def test_contrastive_loss_inside_bf16_autocast_is_the_fp32_one():
    """The loop runs the model, and so the loss, under bf16 autocast: the logits stay fp32 (before: the matmul ran
    in bf16, the positive logit off by up to 0.016 at τ = 0.2)."""
    torch.manual_seed(0)
    q, k = torch.randn(64, 256), torch.randn(64, 256)
    exact = contrastive_loss(q, k, 0.2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = contrastive_loss(q, k, 0.2)
    assert mixed.dtype == torch.float32 and torch.equal(mixed, exact)


def test_moco_mlps_have_the_shapes_of_moco_v3():
    projector, predictor = moco_mlp(3, 192, 4096, 256), moco_mlp(2, 256, 4096, 256)
    kinds = [type(m).__name__ for m in projector]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d"]
    assert [m.out_features for m in projector if isinstance(m, torch.nn.Linear)] == [4096, 4096, 256]
    assert [m.out_features for m in predictor if isinstance(m, torch.nn.Linear)] == [4096, 256]
    assert not projector[-1].affine and all(m.bias is None for m in projector if isinstance(m, torch.nn.Linear))


def test_forward_trains_the_online_branch_only_and_frozen_patch_embedding_stays():
    model = tiny_moco(freeze_patch_embed=True).train()
    x1, x2 = torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32)
    loss = model(x1, x2)
    loss.backward()
    assert loss.item() > 0
    assert model.encoder.blocks[0].attn.qkv.weight.grad is not None and model.predictor[0].weight.grad is not None
    assert model.encoder.patch_embed.proj.weight.grad is None  # MoCo v3's frozen patch projection
    assert all(p.grad is None for p in model.momentum_params())


def test_lgp_groups_put_the_embedding_and_lower_blocks_at_the_ratio():
    model = tiny_moco(depth=3, freeze_patch_embed=True)
    groups = lgp_param_groups(model, lower_blocks=2, lower_lr_ratio=0.1, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    scale = {names[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}
    decay = {names[id(p)]: g["weight_decay"] for g in groups for p in g["params"]}
    assert scale["encoder.blocks.0.attn.qkv.weight"] == scale["encoder.blocks.1.mlp.fc1.weight"] == 0.1
    assert scale["encoder.cls_token"] == scale["encoder.pos_embed"] == 0.1
    assert scale["encoder.blocks.2.attn.qkv.weight"] == scale["encoder.norm.weight"] == 1.0
    assert scale["projector.0.weight"] == scale["predictor.0.weight"] == 1.0
    assert "encoder.patch_embed.proj.weight" not in scale and not any(n.startswith("momentum") for n in scale)
    assert decay["encoder.blocks.0.attn.qkv.weight"] == 0.1
    assert decay["encoder.pos_embed"] == decay["encoder.cls_token"] == decay["encoder.blocks.0.norm1.weight"] == 0.0
    assert block_of("rel_pos_bias.relative_position_bias_table") == -1 and block_of("fc_norm.weight") is None


def test_keys_gathered_across_two_processes_give_the_loss_of_the_whole_batch(tmp_path):
    torch.manual_seed(0)
    q, k = torch.randn(6, 4), torch.randn(6, 4)
    losses = {rank: values[0] for rank, values in on_two_ranks(gathered_loss, tmp_path, q, k).items()}
    # each worker's queries against all 6 keys, its positives at offset 3 × rank
    qn, kn = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(k, dim=1)
    logits = qn @ kn.T / 0.2
    for rank in (0, 1):
        rows = slice(3 * rank, 3 * rank + 3)
        expected = torch.nn.functional.cross_entropy(logits[rows], torch.arange(3) + 3 * rank).item() * 0.4
        assert losses[rank] == pytest.approx(expected, rel=1e-5)
    # equal shares: the mean over workers (what DDP's averaged gradients follow) is the whole batch's loss
    assert (losses[0] + losses[1]) / 2 == pytest.approx(contrastive_loss(q, k, 0.2).item(), rel=1e-5)
