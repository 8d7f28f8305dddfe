"""bench/gpu_evidence.py's pieces that decide what the GPU run measures: the augmentation on the device, the batches,
and the plan that gives each pretraining the same seconds."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from support import bench_module


@pytest.fixture(scope="module")
def ev():
    with bench_module("gpu_evidence") as module:
        yield module


def images(n: int = 6) -> torch.Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_full_crop_without_flip_is_the_image(ev, monkeypatch):
    x = images()
    monkeypatch.setattr(torch, "rand", lambda *s, **k: torch.tensor([[1.0, 0.5, 0.5, 0.5, 0.9]]).expand(s[0], 5))
    out = ev.resized_crop_flip(x, (1.0, 1.0), torch.Generator(), ratio=(1.0, 1.0))
    assert torch.allclose(out, x, atol=1e-5)


def test_flip_mirrors_and_small_crops_zoom(ev, monkeypatch):
    x = images()
    monkeypatch.setattr(torch, "rand", lambda *s, **k: torch.tensor([[1.0, 0.5, 0.5, 0.5, 0.1]]).expand(s[0], 5))
    flipped = ev.resized_crop_flip(x, (1.0, 1.0), torch.Generator(), ratio=(1.0, 1.0))
    assert torch.allclose(flipped, x.flip(-1), atol=1e-5)
    monkeypatch.setattr(torch, "rand", lambda *s, **k: torch.tensor([[0.0, 0.5, 0.5, 0.5, 0.9]]).expand(s[0], 5))
    quarter = ev.resized_crop_flip(x, (0.25, 0.25), torch.Generator(), ratio=(1.0, 1.0))  # the central 16x16, x2
    centre = torch.nn.functional.interpolate(x[:, :, 8:24, 8:24], size=32, mode="bilinear", align_corners=False)
    inner = (slice(None), slice(None), slice(1, -1), slice(1, -1))  # the border reads pixels beyond the box: real ones
    assert torch.allclose(quarter[inner], centre[inner], atol=1e-5)


def test_crops_stay_inside_the_image(ev):
    x = torch.ones(64, 3, 32, 32)
    out = ev.resized_crop_flip(x, (0.08, 1.0), torch.Generator().manual_seed(1))
    assert torch.allclose(out, x)  # reflection padding would show as other values only if a box left the image


def test_random_erase(ev):
    x = images(200)
    assert torch.equal(ev.random_erase(x, 0.0, torch.Generator().manual_seed(0)), x)
    out = ev.random_erase(x, 1.0, torch.Generator().manual_seed(0))
    share = (out != x).any(1).float().mean((1, 2))  # erased share of each image's pixels
    assert (share > 0).all() and share.min() >= 0.015 and share.max() <= 0.36  # timm's 2-33 %, rounded to pixels
    assert 0.1 < share.mean() < 0.25


def test_batches_cover_each_epoch_once(ev):
    b = ev.Batches(10, 3, torch.Generator().manual_seed(0))
    first = torch.cat([b() for _ in range(3)])
    assert len(set(first.tolist())) == 9 and b.epochs == 1  # drop last: 3 of 3 batches, no repeats
    b()
    assert b.epochs == 2 and math.isclose(b.seen_epochs, 1.3)


@pytest.fixture
def plan(ev, monkeypatch):
    """ev.plan with measured step times rop 0.2 s, mask 0.1 s, fine-tune 0.05 s (10 steps an epoch), 600 s left."""
    times = {"rop": 0.2, "mask": 0.1, "finetune": 0.05}
    monkeypatch.setattr(ev, "seconds_per_step", lambda step, *a: times[step.__self__.key])
    monkeypatch.setattr(ev, "Pretraining", lambda c, *a: SimpleNamespace(step=SimpleNamespace(
        __self__=SimpleNamespace(key=c))))
    monkeypatch.setattr(ev, "Finetune", lambda *a: SimpleNamespace(step=SimpleNamespace(
        __self__=SimpleNamespace(key="finetune"))))
    monkeypatch.setattr(ev.time, "perf_counter", lambda: 0.0)
    data = {"x": torch.zeros(1000, 3, 32, 32, dtype=torch.uint8)}

    def run(finetune_epochs: int | None = None, pretrain_epochs: int | None = None) -> dict:
        args = SimpleNamespace(seed=0, tiny=True, minutes=10, reserve=0.0, pretrain_share=0.5,
                               finetune_epochs=finetune_epochs, pretrain_epochs=pretrain_epochs)
        return ev.plan(args, data, ev.Recipe(finetune_batch=100), lambda: None, 0.0)
    return run


def test_plan_gives_each_pretraining_the_same_seconds(plan):
    budget = plan()
    assert budget["pretrain_s"] == {"rop": 150, "mask": 150}  # half of 600 s over two methods
    assert budget["pretrain_steps"] == {"rop": 750, "mask": 1500}  # the slower step gets fewer steps, same seconds
    assert budget["finetune_epochs"] == math.floor(300 / 4 / (10 * 0.05))  # four fine-tunes share the rest


def test_fixed_finetune_epochs_leave_the_rest_to_the_pretrainings(plan):
    budget = plan(finetune_epochs=100)  # 4 fine-tunes x 100 epochs x 0.5 s = 200 s of the 600
    assert budget["finetune_epochs"] == 100 and budget["pretrain_s"] == {"rop": 200, "mask": 200}
    assert budget["pretrain_steps"] == {"rop": 1000, "mask": 2000}
    with pytest.raises(SystemExit, match="--finetune-epochs 300 need 600 s of fine-tuning and 600 s are left"):
        plan(finetune_epochs=300)


def test_fixed_pretraining_epochs_give_both_methods_the_same_steps(plan):
    budget = plan(pretrain_epochs=10)  # 1000 images / batch 1024 x 10 epochs = 10 steps: rop 2 s, mask 1 s
    assert budget["pretrain_steps"] == {"rop": 10, "mask": 10} and budget["pretrain_epochs"]["rop"] == 10.24
    assert budget["finetune_epochs"] == math.floor((600 - 3) / 4 / (10 * 0.05))  # the fine-tunes share the rest
    budget = plan(pretrain_epochs=10, finetune_epochs=5)
    assert budget["finetune_epochs"] == 5 and budget["pretrain_steps"] == {"rop": 10, "mask": 10}
    with pytest.raises(SystemExit, match="--pretrain-epochs 3000 and --finetune-epochs 5 need 879 s of pretraining "
                                         "and 10 s of fine-tuning and 600 s are left"):
        plan(pretrain_epochs=3000, finetune_epochs=5)
    with pytest.raises(SystemExit, match="--pretrain-epochs 3000 need 879 s of pretraining"):
        plan(pretrain_epochs=3000)


def test_one_slow_block_does_not_set_the_step_time(ev, monkeypatch):
    """The seed-9 window: one slow stretch while measuring read the fine-tune step 51% slow and shrank the budget."""
    clock = {"t": 0.0}
    monkeypatch.setattr(ev.time, "perf_counter", lambda: clock["t"])

    def step(i: int) -> None:
        clock["t"] += 0.5 if i == 5 else 0.01  # the second timed block holds one 50x step

    assert ev.seconds_per_step(step, lambda: None, warmup=3, timed=4, blocks=3) == pytest.approx(0.01)
    assert ev.seconds_per_step(step, lambda: None, warmup=3, timed=12, blocks=1) > 0.05  # one mean: the outlier counts
