"""Every shipped pretraining preset parses into a valid PretrainConfig and carries the paper's settings."""

from __future__ import annotations

import pytest

from ropim.cli import _config, _sub, presets
from ropim.train import PretrainConfig

PRETRAIN = presets("pretrain")


def _load(name: str, *overrides: str) -> PretrainConfig:
    parser = _sub(PretrainConfig, "test")
    ns = parser.instantiate(parser.parse_args(["--config", str(PRETRAIN[f"pretrain/{name}"]), *overrides]))
    return _config(ns, PretrainConfig)


@pytest.mark.parametrize("name", [k.split("/", 1)[1] for k in PRETRAIN])
def test_preset_validates(name):
    _load(name, "--data.source", "digits").validate()


def test_paper_presets():
    tiny = _load("vit_tiny_in100")
    assert tiny.model.arch == "vit_tiny_patch16_224"
    assert (tiny.epochs, tiny.global_batch_size, tiny.base_lr) == (800, 512, 1e-3)
    for arch in ("small", "base"):
        cfg = _load(f"vit_{arch}_in1k")
        assert cfg.model.arch == f"vit_{arch}_patch16_224"
        assert (cfg.epochs, cfg.global_batch_size, cfg.base_lr, cfg.warmup_epochs) == (300, 1520, 1.5e-4, 10)
    for name in PRETRAIN:
        cfg = _load(name.split("/", 1)[1])
        assert cfg.model.rho == pytest.approx(1 / 7)
        assert cfg.model.n_tokens > 1 and cfg.model.img_size % cfg.model.patch_size == 0


def test_overrides_apply_after_preset():
    cfg = _load("vit_tiny_in100", "--model.rho", "0.25", "--num_workers", "4", "--accum_steps", "2")
    assert (cfg.model.rho, cfg.num_workers, cfg.accum_steps, cfg.epochs) == (0.25, 4, 2, 800)
