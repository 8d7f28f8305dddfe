"""A sweep's pre-flight refuses, in one line and before Ray, what would make its ranking meaningless: here trials
pretraining on a data set of their own but scored downstream with the built-in digits defaults."""

from __future__ import annotations

import pytest
from PIL import Image

from ropim.errors import ConfigError
from tune.preflight import prepare
from tune.sweep import config_from_args

FLAGS = ["--data.source", "photos", "--global_batch_size", "16", "--no-register", "--workers-per-trial", "1",
         "--cpus-per-worker", "0.5"]


def test_a_sweep_on_its_own_data_scored_downstream_names_that_datas_recipe(workdir):
    for c, shade in (("cat", 40), ("dog", 200)):
        (workdir / "photos" / c).mkdir(parents=True, exist_ok=True)
        for i in range(30):
            Image.new("RGB", (32, 32), (shade, i, 0)).save(workdir / "photos" / c / f"{i}.png")
    with pytest.raises(ConfigError, match=r"^--metric finetune_top1 on data.source=\S+photos: every trial would "
                                          r"fine-tune with the digits demo's recipe"):
        prepare(config_from_args(["--metric", "finetune_top1", *FLAGS]))
    with pytest.raises(ConfigError, match="scored on the built-in digits canvases; give the segmentation data"):
        prepare(config_from_args(["--metric", "segment_miou", *FLAGS]))
    # a recipe of the sweep's own passes; so does the digits recipe on the digits, and kNN on any data
    own = prepare(config_from_args(["--metric", "finetune_top1", "--finetune.epochs", "3", *FLAGS]))
    assert own.finetune["epochs"] == 3
    assert prepare(config_from_args(["--metric", "finetune_top1", *FLAGS[2:]])).metric == "finetune_top1"
    assert prepare(config_from_args(FLAGS)).metric == "knn_top1"
