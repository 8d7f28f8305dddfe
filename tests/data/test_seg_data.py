"""Segmentation sources: the built-in digits canvases, the ADE20K layout (labels shifted, 0 ignored), a folder pair
(seeded split, classes.json), Parquet shards written by `ropim data convert --task segment` holding the same pairs,
pairs that do not fit refused naming the file, and the joint image + mask transforms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from support import run_cli, run_cli_here, write_ade20k

from ropim.data.config import SegDataConfig
from ropim.data.formats.digits import CLASSES, digit_canvases
from ropim.data.pair_lists import ArraySegList
from ropim.data.seg_datasets import SegDataset, seg_eval_transform, seg_train_transform
from ropim.data.sources import open_source
from ropim.errors import ConfigError


def write_pairs(root: Path, n: int = 10, classes: list[str] | None = None) -> Path:
    """ROOT/images/*.png + ROOT/masks/*.png, labels 0..2 and 255, no split folders."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    for i in range(n):
        Image.fromarray(np.full((12, 16, 3), i * 20, np.uint8)).save(root / "images" / f"p{i}.png")
        mask = np.full((12, 16), i % 3, np.uint8)
        mask[0] = 255
        Image.fromarray(mask).save(root / "masks" / f"p{i}.png")
    if classes:
        (root / "classes.json").write_text(json.dumps(classes))
    return root


def test_digit_canvases_are_deterministic_with_labelled_strokes():
    a_img, a_mask = digit_canvases(12, 48, 3)
    b_img, b_mask = digit_canvases.__wrapped__(12, 48, 3)  # built again, not the cached copy
    assert np.array_equal(a_img, b_img) and np.array_equal(a_mask, b_mask)
    assert a_img.shape == (12, 48, 48, 3) and a_mask.shape == (12, 48, 48)
    assert a_mask.max() <= 10 and all((m > 0).any() for m in a_mask)  # every canvas holds a digit
    assert not np.array_equal(digit_canvases(12, 48, 4)[1], a_mask)  # another seed, other canvases
    src = open_source(SegDataConfig(canvases=20, canvas_size=32))
    assert src.classes == CLASSES and len(src.split("train")) == 16 and len(src.split("val")) == 4


def test_ade20k_layout_shifts_labels_and_ignores_zero(tmp_path):
    write_ade20k(tmp_path / "ade", n_train=3, n_val=2)
    cfg = SegDataConfig(source=str(tmp_path / "ade"))
    src = open_source(cfg.validate())
    assert src.format == "ade20k" and len(src.classes) == 150 and src.classes[0] == "1"
    assert [len(src.split(s)) for s in ("train", "val")] == [3, 2]
    image, mask = src.split("train").load(0)
    assert image.size == (48, 40)
    assert mask[0, 0] == 2 and mask[39, 0] == 149 and mask[39, 47] == 255  # 3 -> 2, 150 -> 149, 0 -> ignore


def test_folder_pair_split_by_seed_with_class_names(tmp_path):
    root = write_pairs(tmp_path / "pairs", classes=["sky", "road", "car"])
    src = open_source(SegDataConfig(source=str(root), val_fraction=0.3))
    assert src.format == "pairs" and src.classes == ["sky", "road", "car"]
    assert len(src.split("train")) + len(src.split("val")) == 10 and len(src.split("val")) > 0
    again = open_source(SegDataConfig(source=str(root), val_fraction=0.3))
    assert again.split("val").paths == src.split("val").paths
    with pytest.raises(ConfigError, match="how many classes"):
        open_source(SegDataConfig(source=str(write_pairs(tmp_path / "unnamed"))))
    assert len(open_source(SegDataConfig(source=str(tmp_path / "unnamed"), num_classes=3)).classes) == 3


def test_pairs_that_do_not_fit_are_refused_naming_the_file(tmp_path):
    root = write_pairs(tmp_path / "pairs", n=4, classes=["a", "b", "c"])
    (root / "images" / "extra.png").write_bytes((root / "images" / "p0.png").read_bytes())
    with pytest.raises(ConfigError, match="extra.png has no mask"):
        SegDataConfig(source=str(root)).validate()
    (root / "images" / "extra.png").unlink()
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(root / "masks" / "p1.png")
    with pytest.raises(ConfigError, match="p1.png: mask is 5x5 but the image is 16x12"):
        SegDataConfig(source=str(root)).validate()
    Image.fromarray(np.full((12, 16), 7, np.uint8)).save(root / "masks" / "p1.png")
    with pytest.raises(ConfigError, match="p1.png: mask holds label 7, outside the 3 classes"):
        SegDataConfig(source=str(root)).validate()


def test_train_transform_moves_image_and_mask_together_and_pads_with_ignore():
    mask = np.zeros((32, 32), np.uint8)
    mask[:, :8] = 1  # a stripe on the left
    image = np.where(mask[..., None] == 1, 255, 0).astype(np.uint8).repeat(3, 2)
    pairs = ArraySegList(image[None], mask[None], ["a"], 2)
    flipped = SegDataset(pairs, ["bg", "stripe"], seg_train_transform(32, (1.0, 1.0), hflip=1.0,
                                                                       photometric=False))[0]
    x, y = flipped
    assert x.shape == (3, 32, 32) and y.dtype == torch.int64
    assert (y[:, -8:] == 1).all() and (y[:, :-8] == 0).all()  # the stripe went right with the flip
    assert (x[0, :, -8:] > x[0, :, :-8].max()).all()  # and the bright pixels with it
    torch.manual_seed(0)
    small = SegDataset(pairs, ["bg", "stripe"], seg_train_transform(64, (0.5, 0.5), photometric=True))[0]
    assert small[0].shape == (3, 64, 64) and (small[1] == 255).sum() == 64 * 64 - 32 * 32  # padded: ignored
    x, y = SegDataset(pairs, ["bg", "stripe"], seg_eval_transform(16))[0]
    assert x.shape == (3, 16, 16) and y.shape == (32, 32)  # the labels keep their size for the metrics


def test_evaluation_resize_caps_the_longer_side_as_mmseg():
    """mmseg's test Resize((2048, 512), keep_ratio): the shorter side to the crop, the longer at most 4 crops."""
    from torchvision import tv_tensors

    from ropim.data.seg_datasets import EvalResize

    def resized(h: int, w: int) -> tuple[int, int]:
        image, mask = tv_tensors.Image(torch.zeros(3, h, w)), tv_tensors.Mask(torch.zeros(h, w))
        out, kept = EvalResize(64)(image, mask)
        assert kept.shape == (h, w)
        return tuple(out.shape[-2:])

    assert resized(100, 200) == (64, 128) and resized(300, 150) == (128, 64) and resized(64, 256) == (64, 256)
    assert resized(100, 1000) == (26, 256) and resized(2000, 100) == (256, 13)  # over 4:1: the longer side to 256


def test_convert_writes_parquet_shards_holding_the_same_pairs(tmp_path):
    write_ade20k(tmp_path / "ade", n_train=3, n_val=2)
    proc = run_cli("data", "convert", "ade", "shards", "--task", "segment", "--shard-size", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "shards").glob("*.parquet")) == [
        "train-00000.parquet", "train-00001.parquet", "val-00000.parquet"]
    folder = open_source(SegDataConfig(source=str(tmp_path / "ade")))
    shards = open_source(SegDataConfig(source=str(tmp_path / "shards")))
    assert shards.format == "parquet" and shards.classes == folder.classes
    for split in ("train", "val"):
        by_path = {Path(p).name: i for i, p in enumerate(folder.split(split).paths)}
        assert len(shards.split(split)) == len(by_path)
        for j, path in enumerate(shards.split(split).paths):
            image, mask = shards.split(split).load(j)
            ref_image, ref_mask = folder.split(split).load(by_path[Path(path).name])
            assert np.array_equal(mask, ref_mask) and np.array_equal(np.asarray(image), np.asarray(ref_image))
    again = run_cli("data", "convert", "ade", "shards", "--task", "segment", "--shard-size", "2", cwd=tmp_path)
    assert again.returncode == 0 and "shards written 0, kept 3" in again.stdout


def test_a_pair_shard_damaged_inside_stops_training_naming_it(tmp_path):
    """As an image shard's (tests/data/test_sources.py): a pair shard whose pages cannot be read is one error naming
    it and the fix, not bad pairs skipped."""
    write_ade20k(tmp_path / "ade", n_train=4, n_val=2)
    assert run_cli("data", "convert", "ade", "shards", "--task", "segment", "--shard-size", "2",
                   cwd=tmp_path).returncode == 0
    damaged = tmp_path / "shards" / "train-00001.parquet"
    mask = pq.ParquetFile(damaged).metadata.row_group(0).column(1)  # the mask column's pages
    start, size = mask.dictionary_page_offset or mask.data_page_offset, mask.total_compressed_size
    data = bytearray(damaged.read_bytes())
    data[start:start + size] = bytes(size)  # zeroed, as a disk fault might; the footer stays whole
    damaged.write_bytes(bytes(data))
    ds = SegDataset(open_source(SegDataConfig(source=str(tmp_path / "shards"))).split("train"), ["a"],
                    seg_eval_transform(16))
    with pytest.raises(ConfigError, match=r"train-00001\.parquet cannot be read as Parquet .*delete it and run the "
                                          r"same `ropim data convert` again"):
        for i in range(len(ds)):
            ds[i]
    assert ds.bad.count == 0  # before: every pair of the shard counted bad and skipped, the run going on without them


def test_a_pair_that_vanishes_while_converting_stops_it_not_counted_bad(tmp_path):
    """As an image that cannot be read (tests/data/test_convert.py): a pair's file that cannot be read while
    converting (a link to nothing, a disk gone) stops the conversion naming it; before, it was skipped as a bad pair
    and the conversion ended as if the source held one pair fewer."""
    root = write_pairs(tmp_path / "pairs", n=6)
    (root / "images" / "p9.png").symlink_to(root / "gone.png")  # inside the source: listed, then read
    Image.fromarray(np.zeros((12, 16), np.uint8)).save(root / "masks" / "p9.png")
    proc = run_cli_here("data", "convert", "pairs", "shards", "--task", "segment", "--num-classes", "3", cwd=tmp_path)
    assert proc.returncode == 1 and "source item images/p9.png cannot be read" in proc.stderr, proc.stderr[-2000:]
    assert "the source changed or vanished while converting" in proc.stderr


def test_a_class_count_the_shards_contradict_is_refused_as_a_folders_is(tmp_path):
    """``data.num_classes`` that disagrees with the classes the Parquet shards name is one error naming both, as
    with a folder pair's classes.json (before: silently dropped, the model's head sized by the shards)."""
    write_pairs(tmp_path / "pairs", n=6, classes=["bg", "road", "car"])
    assert run_cli_here("data", "convert", "pairs", "shards", "--task", "segment", cwd=tmp_path).returncode == 0
    for source in ("pairs", "shards"):
        with pytest.raises(ConfigError, match=r"data.num_classes=5 but .* names 3 classes; leave data.num_classes "
                                              r"unset"):
            open_source(SegDataConfig(source=str(tmp_path / source), num_classes=5))
        assert open_source(SegDataConfig(source=str(tmp_path / source), num_classes=3)).classes == ["bg", "road", "car"]


def test_pair_shards_too_large_for_the_nodes_loader_processes_are_said_and_kept_as_asked(tmp_path):
    """As image shards (tests/train/test_task.py): the first epoch's note counts the images and masks each loader
    process keeps (before: never said for pairs), and a list keeps the files it is asked to (before: always 4)."""
    from ropim.data.blocks import holding_note
    from ropim.data.formats.parquet_rows import KEPT_FILES

    write_ade20k(tmp_path / "ade", n_train=8, n_val=2)
    assert run_cli("data", "convert", "ade", "shards", "--task", "segment", "--shard-size", "1",
                   cwd=tmp_path).returncode == 0
    pairs = open_source(SegDataConfig(source=str(tmp_path / "shards"))).split("train")
    per_shard = [pq.ParquetFile(f).metadata.row_group(0) for f in sorted((tmp_path / "shards").glob("train-*"))]
    both = sorted(g.column(0).total_compressed_size + g.column(1).total_compressed_size for g in per_shard)
    assert pairs.kept_bytes() == pytest.approx(sum(both[-KEPT_FILES:]), rel=0.1)  # image and mask columns
    ds = SegDataset(pairs, ["a"], seg_eval_transform(16))
    memory = 4 * 8 * pairs.kept_bytes()  # 8 processes (4 workers × 2) keeping a quarter of it
    assert "for the 8 such processes of the 4 worker(s) on this node, 25% of its memory" in holding_note(ds, 2, 4,
                                                                                                         memory)
    assert holding_note(ds, 2, 4, memory + 1) is None
    one = open_source(SegDataConfig(source=str(tmp_path / "shards"))).split("train", cache_files=1)
    for i in range(len(one)):
        one.raw(i)
    assert len(one.files) == 8 and len(one.cache) == 1


def test_pre_flight_of_pair_shards_reads_a_row_group_not_every_shard(tmp_path, monkeypatch):
    """The pairs a segmentation pre-flight decodes come from the first row group of Parquet shards, as an image
    split's check does (before: 64 pairs spread over the split, each reading its whole shard's images and masks:
    most of the data set, from S3 too, at every validate)."""
    from ropim.data import footers

    write_ade20k(tmp_path / "ade", n_train=8, n_val=4)
    assert run_cli("data", "convert", "ade", "shards", "--task", "segment", "--shard-size", "1",
                   cwd=tmp_path).returncode == 0
    reads, real = [], footers.read_columns
    monkeypatch.setattr(footers, "read_columns", lambda fs, path, columns, row_group=None: reads.append(
        (path.rsplit("/", 1)[-1], tuple(columns), row_group)) or real(fs, path, columns, row_group))
    SegDataConfig(source=str(tmp_path / "shards")).validate()
    images = [r for r in reads if "image" in r[1]]
    assert images == [("train-00000.parquet", ("image", "mask"), 0), ("val-00000.parquet", ("image", "mask"), 0)]


def test_inspect_of_pair_shards_says_the_split_rule_and_what_a_loader_process_keeps(tmp_path):
    """As for image shards: the split rule and the images and masks a loader process keeps (before: neither)."""
    write_ade20k(tmp_path / "ade", n_train=6, n_val=2)
    assert run_cli_here("data", "convert", "ade", "shards", "--task", "segment", "--shard-size", "2",
                        cwd=tmp_path).returncode == 0
    shown = run_cli_here("data", "inspect", "shards", "--task", "segment", cwd=tmp_path)
    pairs = open_source(SegDataConfig(source=str(tmp_path / "shards"))).split("train")
    assert "pairs: train 6  val 2 (split: own)" in shown.stdout, shown.stdout
    assert (f"shards      train 3; a loader process keeps up to 4 of them: {pairs.kept_bytes() / 2**20:,.1f} MiB of "
            "images and masks") in shown.stdout
    folder = run_cli_here("data", "inspect", "digits", "--task", "segment", cwd=tmp_path).stdout
    assert "(split: seeded fraction 0.2 (seed 0))" in folder and "shards" not in folder
