"""One module per source format, one dispatcher: the formats the dispatcher knows are the configs' choices, each
format answers detect / check / source, a forced format that does not fit is refused naming the layout, and a
segmentation folder without a split of its own keeps its split through the one converter."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from sample_data import cifar10
from support import write_ade20k

from ropim.data.config import DataConfig, SegDataConfig
from ropim.data.convert import convert
from ropim.data.formats.common import CLASSIFY, SEGMENT
from ropim.data.pair_lists import ArraySegList, FileSegList
from ropim.data.sources import FORMATS, check_source, formats, open_source
from ropim.errors import ConfigError


def test_the_dispatcher_and_the_configs_name_the_same_formats():
    for cfg, task in ((DataConfig, CLASSIFY), (SegDataConfig, SEGMENT)):
        assert task == cfg.TASK and sorted(formats(task)) == sorted(cfg.FORMATS)
    for fmt in FORMATS:
        assert set(fmt.TASKS) <= {CLASSIFY, SEGMENT}
        assert all(callable(getattr(fmt, hook)) for hook in ("detect", "check", "source"))
    assert [f.NAME for f in FORMATS if f.TASKS == (CLASSIFY, SEGMENT)] == ["digits", "parquet"]


def write_pairs(root, n: int = 12) -> str:
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        Image.fromarray(np.full((8, 10, 3), i * 7 % 256, np.uint8)).save(root / "images" / f"p{i:02d}.png")
        Image.fromarray(np.full((8, 10), i % 2, np.uint8)).save(root / "masks" / f"p{i:02d}.png")
    (root / "classes.json").write_text('["sky", "road"]')
    return str(root)


def test_a_forced_format_that_does_not_fit_names_what_it_expects(tmp_path):
    pairs = write_pairs(tmp_path / "pairs")
    assert check_source(SegDataConfig(source=pairs)) == "pairs"
    with pytest.raises(ConfigError, match="not the ADE20K layout"):
        SegDataConfig(source=pairs, format="ade20k").validate()
    with pytest.raises(ConfigError, match="not a CIFAR python folder"):
        DataConfig(source=pairs, format="cifar").validate()
    with pytest.raises(ConfigError, match="unknown for segmentation"):
        SegDataConfig(source=pairs, format="cifar").validate()
    with pytest.raises(ConfigError, match="is a file but not a Parquet shard"):
        SegDataConfig(source=str(tmp_path / "pairs" / "classes.json")).validate()
    write_ade20k(tmp_path / "ade", n_train=2, n_val=1)
    assert check_source(SegDataConfig(source=str(tmp_path / "ade"))) == "ade20k"
    with pytest.raises(ConfigError, match="holds annotations/ and images/: a segmentation folder pair"):
        check_source(DataConfig(source=str(tmp_path / "ade")))  # its label maps are not a class of images


def test_a_folder_pair_keeps_its_seeded_split_through_the_converter(tmp_path):
    cfg = SegDataConfig(source=write_pairs(tmp_path / "pairs", n=30), val_fraction=0.3, split_seed=4)
    folder = open_source(cfg)
    assert not folder.own_split and isinstance(folder.split("val"), FileSegList)
    report = convert(cfg, str(tmp_path / "shards"), shard_size=8, progress=False)
    assert report.images == {"train": 30} and report.bad_images == 0  # all of it, split again on reading
    shards = open_source(SegDataConfig(source=str(tmp_path / "shards"), val_fraction=0.3, split_seed=4))
    assert shards.format == "parquet" and shards.classes == ["sky", "road"]
    for split in ("train", "val"):
        want, got = folder.split(split), shards.split(split)
        assert sorted(got.paths) == want.paths and 0 < len(got) < 30
        j = got.paths.index(want.paths[0])
        assert np.array_equal(got.load(j)[1], want.load(0)[1])


def test_a_sources_whole_is_its_splits_joined(tmp_path):
    d, _ = cifar10(tmp_path)
    src = open_source(DataConfig(str(d)))
    whole, train, val = src.split(None), src.split("train"), src.split("val")
    assert whole.paths == train.paths + val.paths and np.array_equal(whole.labels, np.r_[train.labels, val.labels])
    assert np.array_equal(whole.images[len(train):], val.images)
    pairs = ArraySegList(np.zeros((4, 2, 2, 3), np.uint8), np.arange(16, dtype=np.uint8).reshape(4, 2, 2),
                         list("abcd"), 16)
    back = pairs.subset(np.array([2, 0])).concat(pairs.subset(np.array([3])))
    assert back.paths == ["c", "a", "d"] and back.raw(2)[1][1, 1] == 15 and back.num_classes == 16
