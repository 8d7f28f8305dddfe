"""``FrozenEvalJob``: the kNN / probe evaluation's fields, declared once for pretrain and graft, and the protocol a
score is named with, so that scores under one name compare (the champion rule)."""

from __future__ import annotations

import pytest
from support import pretrain_preset

from ropim.errors import ConfigError
from ropim.train.graft.config import GraftConfig
from ropim.train.pretrain.config import PretrainConfig


@pytest.mark.parametrize("cls", [PretrainConfig, GraftConfig])
def test_a_score_is_named_with_what_it_depends_on(cls):
    assert cls().protocol("knn_top1") == "knn_top1@k=20"
    assert cls(knn_k=10, eval_train_images=5000).protocol("knn_top1") == "knn_top1@k=10,train=5000"
    assert cls().protocol("linear_top1") == "linear_top1"
    assert cls(eval_train_images=5000).protocol("linear_top1") == "linear_top1@train=5000"
    assert cls(eval_train_images=5000).protocol("finetune_top1") == "finetune_top1"  # no bank in a fine-tune


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_a_sample_holds_at_least_one_image(bad):
    with pytest.raises(ConfigError, match=f"eval_train_images={bad}: must be an integer ≥ 1"):
        PretrainConfig(eval_train_images=bad).validate()


def test_evaluations_beside_training_over_an_imagenet_bank_are_refused_and_the_presets_take_their_share():
    """Rank 0 alone would extract 1.28 M images beside training every 50 epochs, hold their features and search them
    on its CPU; the ImageNet presets evaluate inline, every worker its share."""
    imagenet = 1_281_167
    cfg = PretrainConfig(num_workers=8, epochs=300, eval_every=50)
    with pytest.raises(ConfigError, match=r"eval_async=true with a kNN bank of 1,281,167 train images: every 50 epochs "
                                          r"rank 0 alone .* --eval_async false .* or --eval_train_images 50000"):
        cfg.check_bank(imagenet)
    for fine in (dict(eval_async=False), dict(eval_train_images=50_000), dict(num_workers=1), dict(eval_every=300)):
        PretrainConfig(**{**dict(num_workers=8, epochs=300, eval_every=50), **fine}).check_bank(imagenet)
    PretrainConfig(num_workers=8, epochs=300, eval_every=50).check_bank(126_689)  # ImageNet-100: beside training
    for preset in ("vit_base_in1k", "vit_small_in1k"):
        pretrain_preset(preset).check_bank(imagenet)


@pytest.mark.parametrize("cls", [PretrainConfig, GraftConfig])
def test_a_probe_rank_0_would_fit_past_the_process_groups_timeout_is_refused(cls):
    """On several workers rank 0 fits the probe alone while the others wait in the next collective, which Ray Train
    ends after 30 minutes: ImageNet's 1.28 M train images are refused, a sample or one worker is not."""
    probing = dict(num_workers=8, eval_every=10, eval_linear_probe=True) | \
        ({"eval_async": False} if cls is PretrainConfig else {})  # inline: the bank's rule for beside training aside
    with pytest.raises(ConfigError, match=r"eval_linear_probe=true on 1,281,167 train images: rank 0 .* 30 minutes .* "
                                          r"--eval_train_images 50000 .* or --eval_linear_probe false"):
        cls(**probing).check_bank(1_281_167)
    for fine in (dict(eval_train_images=50_000), dict(num_workers=1), dict(eval_linear_probe=False)):
        cls(**{**probing, **fine}).check_bank(1_281_167)
    cls(**probing).check_bank(100_000)
