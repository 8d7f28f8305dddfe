"""``FrozenEvalJob``: the kNN / probe evaluation's fields, declared once for pretrain and graft, and the protocol a
score is named with, so that scores under one name compare (the champion rule)."""

from __future__ import annotations

import pytest

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
