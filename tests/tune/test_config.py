"""What a sweep's score is compared under (``SweepConfig.protocol``): the champion rule moves an alias only between
scores of one protocol, so a downstream score names its recipe, budget and segmentation data."""

from __future__ import annotations

from dataclasses import replace

from ropim.train.pretrain.config import PretrainConfig
from tune.sweep import config_from_args


def protocol(*flags: str, **trial) -> str:
    cfg = config_from_args(list(flags))
    return cfg.protocol(replace(PretrainConfig.from_dict(cfg.pretrain), **trial))


def test_a_downstream_score_is_compared_only_under_its_own_recipe_and_data():
    assert protocol() == "knn_top1@k=20"  # a frozen evaluation: its k (and bank), as before
    ft = protocol("--metric", "finetune_top1")
    assert ft.startswith("finetune_top1@recipe=")
    assert protocol("--metric", "finetune_top1", seed=7, num_workers=1) == ft  # the trial's seed, workers: one recipe
    assert protocol("--metric", "finetune_top1", "--finetune.epochs", "100") != ft  # before: both "finetune_top1"
    for flag, value in (("log_every", "7"), ("checkpoint_every", "3"), ("dataloader_workers", "2")):
        assert protocol("--metric", "finetune_top1", f"--finetune.{flag}", value) == ft  # the score is the same
    seg = protocol("--metric", "segment_miou")
    assert seg.startswith("segment_miou@recipe=") and seg != protocol(
        "--metric", "segment_miou", "--segment.data.canvases", "400")  # another segmentation data set


def test_a_recipe_from_a_yaml_file_and_one_typed_hash_alike():
    """YAML reads ``warmup_epochs: 1`` as an int, the command line as 1.0: one recipe, one protocol (before: two
    hashes, so the same recipe from a preset file and from flags never competed)."""
    cfg = config_from_args(["--metric", "finetune_top1"])
    trial = PretrainConfig.from_dict(cfg.pretrain)
    as_int = replace(cfg, finetune={**cfg.finetune, "warmup_epochs": 1, "epochs": 10})
    as_float = replace(cfg, finetune={**cfg.finetune, "warmup_epochs": 1.0, "epochs": 10})
    assert as_int.protocol(trial) == as_float.protocol(trial)
