"""``ropim data convert`` of a Parquet source shuffles it through staging (``ropim.data.staging``): shards written
in class order come out mixed, each source shard's images are read once, a killed run resumes without reading them
again, and pairs stay pairs."""

from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image
from sample_data import encode, pixels, write_parquet
from support import log_shard_reads, write_ade20k

from ropim.data import footers, staging
from ropim.data.blocks import mixing_note
from ropim.data.config import DataConfig, SegDataConfig
from ropim.data.convert import convert
from ropim.data.destination import STAGING
from ropim.data.inspect import format_summary, inspect_source
from ropim.data.sources import open_source
from ropim.errors import ConfigError

CLASSES = ["a", "b", "c", "d"]


@pytest.fixture
def class_ordered(tmp_path):
    """4 shards of 30 rows, shard k holding class k alone (a data set written class by class)."""
    root = tmp_path / "src"
    root.mkdir()
    for k in range(4):
        rows = [(encode(Image.fromarray(pixels(16, 16, 30 * k + i)), "PNG"), k, f"{CLASSES[k]}/{i:02d}.png")
                for i in range(30)]
        write_parquet(root / f"train-{k:05d}.parquet", rows, CLASSES)
    return root


def two_shards_a_round(monkeypatch, root, shard_size: int = 20) -> None:
    """Rounds of two shards (of the 6 that 120 rows make)."""
    items = open_source(DataConfig(str(root))).split(None)
    monkeypatch.setattr(staging, "ROUND_BYTES", int(2.5 * staging.encoded_bytes(items) / len(items) * shard_size))


def shards(dst) -> dict[str, list[tuple[str, bytes, int]]]:
    """{shard name: its (path, image, label) rows in order}."""
    out = {}
    for name in sorted(os.listdir(dst)):
        if name.endswith(".parquet"):
            t = pq.read_table(dst / name)
            out[name] = list(zip(t["path"].to_pylist(), t["image"].to_pylist(), t["label"].to_pylist(), strict=True))
    return out


def test_class_ordered_shards_come_out_mixed_each_read_once(class_ordered, tmp_path, monkeypatch):
    source = open_source(DataConfig(str(class_ordered))).split(None)  # no split of its own: all goes to train-*
    assert mixing_note(source) is not None  # the warning that sends users to convert
    assert any("few classes each" in n for n in inspect_source(DataConfig(str(class_ordered)))["notes"])
    two_shards_a_round(monkeypatch, class_ordered)
    held, rounds = staging.held, []
    monkeypatch.setattr(staging, "held", lambda *args: rounds.append(args[2]) or held(*args))
    log_shard_reads(monkeypatch, tmp_path / "reads.log")
    report = convert(DataConfig(str(class_ordered)), str(tmp_path / "out"), shard_size=20, progress=False)
    reads = [line.split()[1] for line in (tmp_path / "reads.log").read_text().splitlines()]
    assert sorted(reads) == sorted(str(f) for f in class_ordered.glob("*.parquet"))  # before: once per shard written
    assert report.shards_written == 6 and report.images == {"train": 120} and rounds == [0, 1, 2]
    assert not (tmp_path / "out" / STAGING).exists()
    written = open_source(DataConfig(str(tmp_path / "out"))).split(None)
    assert mixing_note(written) is None  # before: the source's order, one class a shard
    assert not any("few classes" in n for n in inspect_source(DataConfig(str(tmp_path / "out")))["notes"])
    rows = [r for rs in shards(tmp_path / "out").values() for r in rs]
    src_rows = {p: (img, lab) for p, img, lab in zip(source.paths, map(source.load, range(len(source))), source.labels,
                                                     strict=True)}
    assert len(rows) == 120 and {p: (img, lab) for p, img, lab in rows} == src_rows  # every image once, its label
    monkeypatch.setattr(staging, "ROUND_BYTES", 1 << 30)  # one round: the same shards (the plan's order)
    convert(DataConfig(str(class_ordered)), str(tmp_path / "one"), shard_size=20, progress=False)
    assert shards(tmp_path / "one") == shards(tmp_path / "out")


def test_a_killed_shuffled_conversion_resumes_from_its_staging(class_ordered, tmp_path, monkeypatch):
    two_shards_a_round(monkeypatch, class_ordered)
    convert(DataConfig(str(class_ordered)), str(tmp_path / "whole"), shard_size=20, progress=False)
    held, calls = staging.held, []

    def killed(*args):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated kill")  # as the second round starts
        return held(*args)

    monkeypatch.setattr(staging, "held", killed)
    dst = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, progress=False)
    assert len(list(dst.glob("train-*.parquet"))) == 2 and len(list((dst / STAGING).iterdir())) == 4
    monkeypatch.setattr(staging, "held", held)
    log_shard_reads(monkeypatch, tmp_path / "reads.log")
    report = convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, progress=False)
    assert not (tmp_path / "reads.log").exists()  # staged already: no source image read again
    assert (report.shards_kept, report.shards_written) == (2, 4) and not (dst / STAGING).exists()
    assert shards(dst) == shards(tmp_path / "whole")


def test_a_conversion_stopped_while_staging_keeps_what_it_staged(class_ordered, tmp_path, monkeypatch):
    """Ctrl-C while staging, in a destination the run created: it is kept (staging an ImageNet is hours of reads),
    and the same command stages only the rest."""
    read, calls = footers.read_columns, []

    def interrupted(fs, file, columns, **kwargs):
        if "image" in columns:
            if len(calls) == 2:
                raise KeyboardInterrupt  # as the third source shard is read
            calls.append(file)
        return read(fs, file, columns, **kwargs)

    monkeypatch.setattr(footers, "read_columns", interrupted)
    dst = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, progress=False)
    assert len(list((dst / STAGING).glob("*.parquet"))) == 2 and not list(dst.glob("train-*"))
    monkeypatch.setattr(footers, "read_columns", read)
    log_shard_reads(monkeypatch, tmp_path / "reads.log")
    assert convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, progress=False).shards_written == 6
    assert len((tmp_path / "reads.log").read_text().splitlines()) == 2  # the two shards not staged yet
    assert not (dst / STAGING).exists()


def test_a_conversion_written_in_the_source_order_is_finished_with_shuffle_false(class_ordered, tmp_path):
    """What an earlier version wrote of a Parquet source (its order, whatever --shuffle said): the same command now
    plans a shuffle, so it is refused, and the line says how to finish the old one."""
    dst = tmp_path / "out"
    convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, shuffle=False, progress=False)
    with pytest.raises(ConfigError, match=r"--shuffle / --seed differ\); add --shuffle false to finish it, or give"):
        convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, progress=False)
    with pytest.raises(ConfigError, match=r"re-run the command that wrote it"):  # another change: the usual fix
        convert(DataConfig(str(class_ordered)), str(dst), shard_size=30, progress=False)
    assert convert(DataConfig(str(class_ordered)), str(dst), shard_size=20, shuffle=False,
                   progress=False).shards_kept == 6


def test_shuffled_pairs_stay_pairs(tmp_path, monkeypatch):
    write_ade20k(tmp_path / "ade", n_train=6, n_val=2)
    convert(SegDataConfig(source=str(tmp_path / "ade")), str(tmp_path / "pq"), shard_size=3, shuffle=False,
            progress=False)
    monkeypatch.setattr(staging, "ROUND_BYTES", 1)  # a shard a round
    convert(SegDataConfig(source=str(tmp_path / "pq")), str(tmp_path / "out"), shard_size=2, progress=False)
    before, after = (open_source(SegDataConfig(source=str(tmp_path / d))) for d in ("pq", "out"))
    for split in ("train", "val"):
        ref = {p: i for i, p in enumerate(before.split(split).paths)}
        got = after.split(split)
        assert sorted(got.paths) == sorted(ref)
        assert split == "val" or list(got.paths) != list(before.split(split).paths)  # shuffled (val: 2 pairs)
        for j, path in enumerate(got.paths):
            image, mask = got.load(j)
            ref_image, ref_mask = before.split(split).load(ref[path])
            assert np.array_equal(mask, ref_mask) and np.array_equal(np.asarray(image), np.asarray(ref_image))


def test_inspect_says_what_a_loader_process_keeps(class_ordered):
    """Before a run: how many train shards, and the images a loader process keeps of them (its 4 largest shards'
    train rows, from the footers), to size --dataloader_workers."""
    info = inspect_source(DataConfig(str(class_ordered)))
    train = open_source(DataConfig(str(class_ordered))).split("train")
    held = sum(len(train.load(i)) for i in range(len(train)))  # 4 shards: all of them are kept
    assert info["shards"]["train"] == 4 and 0.9 * held <= info["shards"]["kept_bytes"] <= 1.1 * held
    kept = info["shards"]["kept_bytes"] / 2**20
    assert f"shards      train 4; a loader process keeps up to 4 of them: {kept:,.1f} MiB" in format_summary(info)


def test_ray_data_pretraining_on_class_ordered_shards_says_so_before_it_trains(class_ordered, ray_session, caplog):
    """The note the DataLoader path gave, now for Ray Data too: its batches mix a few 500-row pieces of shards."""
    from ropim.train.pretrain.config import PretrainConfig
    from ropim.train.pretrain.task import PretrainTask

    cfg = PretrainConfig(data=DataConfig(str(class_ordered)), ingest="ray_data")
    with caplog.at_level(logging.WARNING, logger="ropim.train"):
        inputs, datasets = PretrainTask.inputs(cfg)
    notes = [r.getMessage() for r in caplog.records if "few classes each" in r.getMessage()]
    assert 0 < inputs["n_train"] < 120 and "train" in datasets  # the seeded val fraction aside
    assert len(notes) == 1 and "Ray Data mixes each batch from a few 500-row pieces of shards" in notes[0]
