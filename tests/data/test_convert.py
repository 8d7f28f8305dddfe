"""`ropim data convert` / `inspect`: round trips that keep every image, label and split; resumable writes."""

from __future__ import annotations

import json
import os
import shutil
import socket

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from sample_data import cifar10, pixels, write_parquet

from ropim.cli import main as cli_main
from ropim.data import convert as convert_mod
from ropim.data.config import DataConfig
from ropim.data.convert import convert
from ropim.data.decode import decode_rgb
from ropim.data.destination import META_KEY, PLAN
from ropim.data.inspect import inspect_source
from ropim.data.lists import FileList, ImageList
from ropim.data.sources import open_source
from ropim.errors import ConfigError


def _read_dst(dst) -> dict[str, dict[str, tuple[bytes, int]]]:
    out = {}
    for f in sorted(os.listdir(dst)):
        if f.endswith(".parquet"):
            t = pq.read_table(dst / f)
            split = f.split("-")[0]
            for img, label, path in zip(t["image"].to_pylist(), t["label"].to_pylist(), t["path"].to_pylist(),
                                        strict=True):
                out.setdefault(split, {})[path] = (img, label)
    return out


def test_convert_inspect_round_trip_keeps_every_image_label_and_split(folder, tmp_path):
    root, good, broken = folder
    cfg = DataConfig(str(root))
    rep = convert(cfg, str(tmp_path / "out"), shard_size=3, progress=False)
    assert rep.bad_images == 1 and rep.bad_paths == [broken] and rep.images == {"train": len(good)}
    got = _read_dst(tmp_path / "out")["train"]
    assert {p: v[1] for p, v in got.items()} == good
    assert all(got[p][0] == (root / p).read_bytes() for p in good)  # original bytes kept
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == ["cat", "dog"]
    meta = pq.read_schema(tmp_path / "out" / "train-00000.parquet").metadata
    assert json.loads(meta[b"classes"]) == ["cat", "dog"]

    out_cfg = DataConfig(str(tmp_path / "out"))
    info, src_info = inspect_source(out_cfg), inspect_source(cfg)
    assert info["format"] == "parquet" and info["classes"] == ["cat", "dog"]
    assert sum(info["images"].values()) == len(good) == sum(src_info["images"].values()) - 1
    for split in ("train", "val"):  # the same seeded split on both sides, minus the corrupt file
        want = set(open_source(cfg).split(split).paths) - {broken}
        assert set(open_source(out_cfg).split(split).paths) == want
    assert info["image_size"]["width"]["min"] == 16 and info["image_size"]["width"]["max"] == 32


def test_convert_cifar_keeps_pixels_and_its_own_split(tmp_path):
    d, expect = cifar10(tmp_path)
    rep = convert(DataConfig(str(d)), str(tmp_path / "out"), shard_size=4, progress=False)
    assert rep.images == {"train": 10, "val": 5} and rep.bad_images == 0
    out_cfg = DataConfig(str(tmp_path / "out"))
    src = open_source(out_cfg)
    assert src.own_split and src.classes == [f"c{i}" for i in range(10)]
    for split in ("train", "val"):
        lst = src.split(split)
        order = np.argsort([int(p.split("_")[-1].split(".")[0]) + 100 * int(p.split("_")[1]) for p in lst.paths])
        pixels = np.stack([np.asarray(decode_rgb(lst.load(int(i)))) for i in order])
        np.testing.assert_array_equal(pixels, expect[split][0])  # PNG: lossless
        np.testing.assert_array_equal(lst.labels[order], expect[split][1])


def test_a_converted_parquet_set_without_paths_keeps_its_split(parquet_set, tmp_path):
    """Shards with no ``path`` column and no split of their own are split by each image's bytes; their copy keeps
    ``path`` null, so that it splits the same (before: the copy stored 'file#row' names, split by those: another
    val set, a model pretrained on the source scored on images it had trained on)."""
    _, rows = parquet_set
    flat = tmp_path / "flat"
    flat.mkdir()
    write_parquet(flat / "part-0.parquet", rows["train"] + rows["val"], ["a", "b", "c"], with_path=False)
    convert(DataConfig(str(flat)), str(tmp_path / "out"), shard_size=7, progress=False)
    splits = {}
    for root in (flat, tmp_path / "out"):
        src = open_source(DataConfig(str(root), val_fraction=0.3, split_seed=5))
        splits[root.name] = [sorted(lst.load(i) for i in range(len(lst))) for lst in map(src.split, ("train", "val"))]
    assert len(splits["flat"][1]) >= 5 and splits["out"] == splits["flat"]


def test_interrupted_convert_leaves_only_whole_shards_and_rerun_completes(folder, tmp_path, monkeypatch):
    root, good, _ = folder
    cfg, dst = DataConfig(str(root)), tmp_path / "out"
    monkeypatch.setattr(convert_mod, "ROW_GROUP", 2)  # 2 write calls per 3-image shard
    real_write, calls = pq.ParquetWriter.write_table, {"n": 0}

    def failing_write(self, table, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:  # the second call of the second shard: mid-shard
            raise KeyboardInterrupt("simulated kill")
        return real_write(self, table, *a, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing_write)
    with pytest.raises(KeyboardInterrupt):
        convert(cfg, str(dst), shard_size=3, progress=False)
    names = sorted(os.listdir(dst))
    assert names == ["classes.json", "ropim_convert.json", "train-00000.parquet"]  # no partial shard or temp file
    assert pq.read_metadata(dst / "train-00000.parquet").num_rows >= 2
    with pytest.raises(ConfigError, match=r"is an unfinished `ropim data convert` \(1 of its 3 shards written"):
        DataConfig(str(dst)).validate()  # a job does not take the one shard for the data set
    with pytest.raises(ConfigError, match=r"is an unfinished `ropim data convert` \(1 of its 3 shards written"):
        DataConfig(f"{dst}/*.parquet").validate()  # nor through a glob (before: read as a data set of one shard)
    DataConfig(f"{dst}/train-00000.parq*").validate()  # a glob naming only written shards: a subset, on purpose
    (dst / ".train-00001.parquet.tmp").write_bytes(b"half a shard from a killed run")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", real_write)
    rep = convert(cfg, str(dst), shard_size=3, progress=False)
    assert rep.shards_kept == 1 and rep.shards_written == 2 and rep.images == {"train": len(good)}
    assert not [n for n in os.listdir(dst) if n.endswith(".tmp")]
    assert {p: v[1] for p, v in _read_dst(dst)["train"].items()} == good
    again = convert(cfg, str(dst), shard_size=3, progress=False)
    assert again.shards_written == 0 and again.shards_kept == 3
    before = {n: (dst / n).read_bytes() for n in os.listdir(dst)}
    with pytest.raises(ConfigError, match=r"holds a conversion with other settings: its shards \(the source's images "
                                          r"changed since, or --shard-size"):  # another plan: refused
        convert(cfg, str(dst), shard_size=5, progress=False)
    assert {n: (dst / n).read_bytes() for n in os.listdir(dst)} == before  # nothing deleted or overwritten


def test_a_rerun_over_a_source_changed_at_the_same_count_is_refused(folder, tmp_path):
    """A conversion's plan records its items (paths and labels), not only their count: a mislabelled image moved to
    its class between two runs is not left in the shards already written (before: every shard kept, unchanged)."""
    root, dst = tmp_path / "src", tmp_path / "out"
    shutil.copytree(folder[0], root)
    convert(DataConfig(str(root)), str(dst), shard_size=3, progress=False)
    (root / "cat" / "c1.png").rename(root / "dog" / "c1.png")
    with pytest.raises(ConfigError, match=r"holds a conversion with other settings: its shards \(the source's "
                                          r"images changed since"):
        convert(DataConfig(str(root)), str(dst), shard_size=3, progress=False)


def test_cli_convert_then_inspect(parquet_set, tmp_path, capsys):
    root, rows = parquet_set
    cli_main(["data", "convert", str(root), str(tmp_path / "out"), "--shard-size", "16"])
    assert "train 40  val 10 images" in capsys.readouterr().out
    cli_main(["data", "inspect", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "parquet" in out and "train 40  val 10" in out and "classes     3: a, b, c" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["classes.json", "ropim_convert.json", "train-00000.parquet",
                                                     "train-00001.parquet", "train-00002.parquet", "val-00000.parquet"]


def test_convert_never_loses_the_source(folder, parquet_set, tmp_path):
    """The data-loss cases: a converted folder onto itself (to re-shard), an ImageFolder into a sub-folder of itself
    and the same command again: each is refused before anything is written, and every row stays."""
    root, rows = parquet_set
    copy = tmp_path / "shards"
    convert(DataConfig(str(root)), str(copy), shard_size=16, progress=False)
    before = {n: (copy / n).read_bytes() for n in os.listdir(copy)}
    with pytest.raises(ConfigError, match="is the source itself"):
        convert(DataConfig(str(copy)), str(copy), shard_size=8, progress=False)
    assert {n: (copy / n).read_bytes() for n in os.listdir(copy)} == before
    assert inspect_source(DataConfig(str(copy)))["images"] == {"train": 40, "val": 10}

    images, good, _ = folder
    for _ in range(2):  # the README's way to resume is to run the same command again
        with pytest.raises(ConfigError, match="inside the source"):
            convert(DataConfig(str(images)), str(images / "parquet"), progress=False)
    assert not (images / "parquet").exists()
    with pytest.raises(ConfigError, match="holds the source"):
        convert(DataConfig(str(images)), str(images.parent), progress=False)
    assert len(open_source(DataConfig(str(images))).split(None)) == len(good) + 1


def test_source_that_vanishes_mid_run_is_an_error_not_bad_images(folder, tmp_path, monkeypatch):
    images, good, _ = folder
    real_load = FileList.load

    def vanishing(self, i):
        if i >= 3:
            raise FileNotFoundError(f"{self.file(i)} vanished")
        return real_load(self, i)

    monkeypatch.setattr(FileList, "load", vanishing)
    with pytest.raises(ConfigError, match="cannot be read .* the source changed or vanished"):
        convert(DataConfig(str(images)), str(tmp_path / "out"), shard_size=100, progress=False)
    assert not (tmp_path / "out").exists()  # nothing whole was written, and the run leaves no trace


def test_convert_refuses_a_source_none_of_whose_images_decodes(tmp_path):
    """No image decodes: one line naming the source, a non-zero exit, and no empty data set left behind (a folder
    the run created is removed; one that was there keeps the empty shards, which readers refuse)."""
    src = tmp_path / "allbad"
    for rel, text in (("a/1.png", "x"), ("b/2.jpg", "y")):
        (src / rel).parent.mkdir(parents=True)
        (src / rel).write_text(text)
    with pytest.raises(SystemExit, match=f"ropim data convert: data source '{src}': none of its 2 images decodes "
                                         r"\(e.g. a/1.png\), so no data set was written; replace"):
        cli_main(["data", "convert", str(src), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
    (tmp_path / "there").mkdir()
    with pytest.raises(ConfigError, match="none of its 2 images .* keeps the shards written, which readers refuse"):
        convert(DataConfig(str(src)), str(tmp_path / "there"), progress=False)
    with pytest.raises(ConfigError, match="no rows; the data set is empty"):
        open_source(DataConfig(str(tmp_path / "there")))


def test_convert_refuses_a_split_none_of_whose_images_decodes(folder, tmp_path):
    """A source with its own split whose val images all fail: refused naming the split; the train shards stay, and
    the converted set, whose val split is empty, is refused by readers."""
    images, good, _ = folder
    src = tmp_path / "split"
    for rel in good:
        (src / "train" / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / "train" / rel).write_bytes((images / rel).read_bytes())
    for rel in ("cat/v.png", "dog/v.jpg"):
        (src / "val" / rel).parent.mkdir(parents=True)
        (src / "val" / rel).write_text("not an image")
    with pytest.raises(ConfigError, match=f"data source '{src}': none of the 2 images of its val split decodes"):
        convert(DataConfig(str(src)), str(tmp_path / "out"), progress=False)
    assert pq.read_metadata(tmp_path / "out" / "train-00000.parquet").num_rows == len(good)
    with pytest.raises(ConfigError, match="split 'val' is empty"):
        open_source(DataConfig(str(tmp_path / "out"))).split("val")


def images(root, names: dict[str, int]) -> None:
    """``root/<class>/<name>``: 8x8 noise images of the given seeds."""
    for rel, seed in names.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels(8, 8, seed)).save(root / rel)


def leftover(dst, source: str, shards: int = 2, rows: int = 0) -> dict[str, bytes]:
    """What a convert that wrote no row (an older version's, which ended with an empty data set) left in ``dst``:
    its plan, classes.json and shards carrying its metadata, ``rows`` rows each. Returns every file's bytes."""
    dst.mkdir()
    metas = {f"train-{k:05d}.parquet": {"split": "train", "index": k, "shards": shards, "shard_size": 1000,
                                        "items": 1500, "shuffle": True, "seed": 0, "format": "imagefolder",
                                        "source": source, "on_bad_image": "skip"} for k in range(shards)}
    for name, meta in metas.items():
        table = pa.table({"image": [b"x"] * rows, "label": [0] * rows, "path": ["a/x.png"] * rows},
                         schema=ImageList.SCHEMA)
        pq.write_table(table.replace_schema_metadata({b"classes": b'["a", "b"]', META_KEY: json.dumps(meta).encode()}),
                       dst / name)
    (dst / "classes.json").write_text('["a", "b"]')
    (dst / PLAN).write_text(json.dumps({"source": source, "format": "imagefolder", "classes": ["a", "b"],
                                        "shards": metas}, indent=2))
    return {f.name: f.read_bytes() for f in dst.iterdir()}


def test_convert_into_an_earlier_conversion_that_holds_no_image(tmp_path, monkeypatch, capsys, caplog):
    """A folder an earlier convert left with only empty shards (all its images failed to decode; an older version
    ended so with exit 0) is converted into, with one line saying it was removed, whatever source it was of: the
    same command failed until the user deleted the folder."""
    monkeypatch.chdir(tmp_path)
    images(tmp_path / "pics", {"a/1.png": 1, "b/2.png": 2, "b/3.png": 3})
    leftover(tmp_path / "out", "/elsewhere/old-pics")
    with caplog.at_level("INFO", logger="ropim"):
        cli_main(["data", "convert", "pics", "out"])
    assert "out: train 3 images; shards written 1, kept 0" in capsys.readouterr().out
    assert [r.message for r in caplog.records if "earlier conversion" in r.message] == [
        f"convert destination {tmp_path / 'out'}: removed an earlier conversion there that holds no image (2 shards "
        "without rows, its plan and classes.json); converting afresh"]
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == ["classes.json", PLAN, "train-00000.parquet"]
    assert json.loads((tmp_path / "out" / PLAN).read_text())["source"] == str(tmp_path / "pics")


def test_the_same_convert_after_fixing_the_images_writes_its_empty_shards_again(folder, tmp_path, monkeypatch):
    """All images bad into a folder that was there, then fixed: the same command converts (it kept its empty shards
    and failed again). A source whose val images were bad, then fixed: the val shard is written again, the train
    shard kept."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad" / "a").mkdir(parents=True)
    (tmp_path / "bad" / "a" / "1.png").write_text("not an image")
    (tmp_path / "out").mkdir()
    with pytest.raises(ConfigError, match="none of its 1 images decodes .* the same command replaces them"):
        convert(DataConfig("bad"), "out", progress=False)
    images(tmp_path / "bad", {"a/1.png": 1})
    assert convert(DataConfig("bad"), "out", progress=False).images == {"train": 1}

    root, good, _ = folder
    images(tmp_path / "split" / "train", {rel: 10 + i for i, rel in enumerate(good)})
    for rel in ("cat/v.png", "dog/v.png"):
        (tmp_path / "split" / "val" / rel).parent.mkdir(parents=True)
        (tmp_path / "split" / "val" / rel).write_text("not an image")
    with pytest.raises(ConfigError, match="none of the 2 images of its val split decodes"):
        convert(DataConfig("split"), "split-out", progress=False)
    images(tmp_path / "split" / "val", {"cat/v.png": 1, "dog/v.png": 2})
    rep = convert(DataConfig("split"), "split-out", progress=False)
    assert rep.images == {"train": len(good), "val": 2} and (rep.shards_kept, rep.shards_written) == (1, 1)


def test_a_folder_with_rows_or_files_of_others_is_never_cleared(tmp_path, monkeypatch):
    """Empty shards beside a shard with rows, a file convert did not write, or a shard that cannot be read: the
    folder is refused as before and keeps every byte."""
    monkeypatch.chdir(tmp_path)
    images(tmp_path / "pics", {"a/1.png": 1, "b/2.png": 2})
    cases = {"rows": leftover(tmp_path / "rows", "/elsewhere/old", rows=1)}
    cases["foreign"] = leftover(tmp_path / "foreign", "/elsewhere/old")
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    cases["foreign"]["notes.txt"] = b"mine"
    cases["cut"] = leftover(tmp_path / "cut", "/elsewhere/old")
    (tmp_path / "cut" / "train-00001.parquet").write_bytes(cases["cut"]["train-00001.parquet"][:50])
    cases["cut"]["train-00001.parquet"] = cases["cut"]["train-00001.parquet"][:50]
    for name, files in cases.items():
        with pytest.raises(ConfigError, match=f"convert destination '{tmp_path / name}' holds"):
            convert(DataConfig("pics"), name, progress=False)
        assert {f.name: f.read_bytes() for f in (tmp_path / name).iterdir()} == files, name


@pytest.mark.faults  # Ctrl+C sent to a running conversion
def test_a_stopped_conversion_says_its_shards_are_kept_and_the_same_command_finishes(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    argv = [sys.executable, "-m", "ropim.cli", "data", "convert", "digits", "out", "--shard-size", "10"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out").glob("train-*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)  # 180 shards of 10: the first is written, most are not
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == ("ropim data convert: stopped by SIGINT; the shards written so far are "
                                            "kept, and the same command writes the rest")
    kept = len(list((tmp_path / "out").glob("*-*.parquet")))
    inspect = [sys.executable, "-m", "ropim.cli", "data", "inspect", "out"]
    early = subprocess.run(inspect, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert early.returncode != 0 and early.stderr.strip().splitlines() == [
        f"ropim data inspect: data source '{tmp_path / 'out'}' is an unfinished `ropim data convert` ({kept} of its "
        f"180 shards written, train-{kept:05d}.parquet not yet): run the same convert command again to finish it (it "
        "writes the missing shards only)"], early.stderr  # read as it is, it would be a data set of a few images
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"kept {kept}" in done.stdout and kept >= 1
    assert subprocess.run(inspect, cwd=tmp_path, capture_output=True, timeout=120).returncode == 0


def test_a_second_convert_into_a_folder_being_written_is_refused(tmp_path):
    """Before, the second removed the first's temporary shard (as a killed run's) and both failed to rename theirs
    (`[Errno 2] Failed to rename`), or removed the folder the other was writing. The first is held here at its guard
    (the digits convert in seconds, faster than a second process starts)."""
    import subprocess
    import sys

    import pyarrow.fs as pafs

    from ropim.data.destination import guarded

    (tmp_path / "out").mkdir()
    argv = [sys.executable, "-m", "ropim.cli", "data", "convert", "digits", "out", "--shard-size", "10"]
    with guarded(pafs.LocalFileSystem(), str(tmp_path / "out"), "out"):  # a conversion writing it
        second = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert second.returncode != 0 and second.stderr.strip().splitlines() == [
        f"ropim data convert: convert destination '{tmp_path / 'out'}' is being written by another `ropim data "
        f"convert` (pid {os.getpid()} on {socket.gethostname()}) right now: wait for it to end; the same command "
        "then reports or finishes it"], second.stderr
    assert os.listdir(tmp_path / "out") == []  # nothing written by the refused one; the guard gone with the first
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and len(list((tmp_path / "out").glob("train-*.parquet"))) == 180, done.stderr
    assert ".ropim_convert.lock" not in os.listdir(tmp_path / "out")
