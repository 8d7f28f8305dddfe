"""Data layer: every source format read back exactly, convert → inspect round trip, resumable convert,
the bad-image policy, clear errors, and Ray Data ingest inside a 2-worker TorchTrainer on 2 CPUs.

Every data set is built here, small; nothing under /work/shared is needed.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from ropim import convert as convert_mod
from ropim.cli import main as cli_main
from ropim.convert import convert
from ropim.data import DataConfig, build_dataset, count_images, eval_transform, pretrain_transform
from ropim.errors import ConfigError
from ropim.sources import BadImageError, decode_rgb, open_source, split_list
from ropim.summary import inspect_source

RNG = np.random.default_rng(0)


def _pixels(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """ImageFolder: cat/ (PNG, one greyscale, one palette), dog/ (JPEG, one RGBA PNG, one WebP), one corrupt JPEG.

    Returns (root, {relative path: label} of the good images, relative path of the corrupt one).
    """
    root = tmp_path_factory.mktemp("folder")
    good = {}
    files = {
        "cat/c0.png": Image.fromarray(_pixels(20, 16, 1)),
        "cat/c1.png": Image.fromarray(_pixels(24, 24, 2)),
        "cat/grey.png": Image.fromarray(_pixels(18, 18, 3)[..., 0], mode="L"),
        "cat/sub/palette.png": Image.fromarray(_pixels(16, 16, 4)).convert("P"),
        "dog/d0.jpg": Image.fromarray(_pixels(32, 32, 5)),
        "dog/d1.jpeg": Image.fromarray(_pixels(30, 28, 6)),
        "dog/rgba.png": Image.fromarray(np.dstack([_pixels(16, 20, 7), np.full((16, 20), 128, np.uint8)]),
                                        mode="RGBA"),
        "dog/d2.webp": Image.fromarray(_pixels(16, 16, 8)),
    }
    for rel, img in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        img.save(root / rel)
        good[rel] = 0 if rel.startswith("cat") else 1
    jpeg = _encode(Image.fromarray(_pixels(32, 32, 9)), "JPEG")
    (root / "dog" / "broken.jpg").write_bytes(jpeg[: len(jpeg) // 2])  # truncated: the header reads fine
    (root / "dog" / "notes.txt").write_text("not an image")  # ignored: not an image extension
    return root, good, "dog/broken.jpg"


def _cifar10(root, n_train=(6, 4), n_test=5, classes=10):
    """The official cifar-10-batches-py layout (Python-2 style pickles: bytes keys) with tiny batches."""
    d = root / "cifar-10-batches-py"
    d.mkdir()
    expect = {"train": ([], []), "val": ([], [])}
    batches = [(f"data_batch_{i + 1}", n, "train") for i, n in enumerate(n_train)] + [("test_batch", n_test, "val")]
    for k, (name, n, split) in enumerate(batches):
        imgs = np.stack([_pixels(32, 32, 100 * k + i) for i in range(n)])
        labels = [int(x) for x in RNG.integers(0, classes, n)]
        data = imgs.transpose(0, 3, 1, 2).reshape(n, 3072)
        with open(d / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"data": data,
                         b"filenames": [f"img_{k}_{i}.png".encode() for i in range(n)]}, f, protocol=2)
        expect[split][0].append(imgs)
        expect[split][1].extend(labels)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(classes)], b"num_vis": 3072}, f, protocol=2)
    return d, {s: (np.concatenate(v[0]), np.array(v[1])) for s, v in expect.items()}


def _write_parquet(path, rows, classes=None, with_path=True):
    cols = {"image": [r[0] for r in rows], "label": pa.array([r[1] for r in rows], pa.int64())}
    if with_path:
        cols["path"] = [r[2] for r in rows]
    table = pa.table(cols)
    if classes is not None:
        table = table.replace_schema_metadata({b"classes": json.dumps(classes).encode()})
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def parquet_set(tmp_path_factory):
    """Parquet shards with their own split (train-*, val-*), classes in the schema metadata. 40 + 10 rows."""
    root = tmp_path_factory.mktemp("pq")
    rows = {"train": [], "val": []}
    for split, n in (("train", 40), ("val", 10)):
        for i in range(n):
            label = i % 3
            rows[split].append((_encode(Image.fromarray(_pixels(32, 32, 1000 + i + 100 * len(split))), "JPEG"),
                                label, f"{split}/{label}/{i:03d}.jpg"))
    _write_parquet(root / "train-00000.parquet", rows["train"][:25], ["a", "b", "c"])
    _write_parquet(root / "train-00001.parquet", rows["train"][25:], ["a", "b", "c"])
    _write_parquet(root / "val-00000.parquet", rows["val"], ["a", "b", "c"])
    return root, rows


# ------------------------------------------------------------------------------------------ reading back


def test_imagefolder_lists_every_image_with_its_label_and_decodes_to_rgb(folder):
    root, good, broken = folder
    cfg = DataConfig(str(root))
    src = open_source(cfg)
    assert src.format == "imagefolder" and src.classes == ["cat", "dog"] and not src.own_split
    everything = split_list(src, cfg, None)
    assert dict(zip(everything.paths, everything.labels.tolist(), strict=True)) == {**good, broken: 1}
    train, val = split_list(src, cfg, "train"), split_list(src, cfg, "val")
    assert sorted(train.paths + val.paths) == sorted(everything.paths) and not set(train.paths) & set(val.paths)
    assert count_images(cfg, "train") == len(train)
    for rel in good:
        img = decode_rgb((root / rel).read_bytes())
        assert img.mode == "RGB" and img.size == Image.open(root / rel).size
    grey = np.asarray(decode_rgb((root / "cat/grey.png").read_bytes()))
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 0] == grey[..., 2]).all()


def test_imagefolder_own_train_val_split(tmp_path):
    for split, n in (("train", 3), ("val", 2)):
        for c in ("x", "y"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(_pixels(8, 8, i)).save(tmp_path / split / c / f"{i}.png")
    cfg = DataConfig(str(tmp_path))
    src = open_source(cfg)
    assert src.own_split and src.classes == ["x", "y"]
    val = split_list(src, cfg, "val")
    assert len(split_list(src, cfg, "train")) == 6 and len(val) == 4
    assert sorted(zip(val.paths, val.labels.tolist(), strict=True))[0] == ("val/x/0.png", 0)


def test_cifar10_and_cifar100_official_layouts(tmp_path):
    d, expect = _cifar10(tmp_path)
    for location in (d, tmp_path):  # the batches folder itself, or its parent
        cfg = DataConfig(str(location))
        src = open_source(cfg)
        assert src.format == "cifar" and src.own_split and src.classes == [f"c{i}" for i in range(10)]
        for split in ("train", "val"):
            lst = split_list(src, cfg, split)
            np.testing.assert_array_equal(lst.images, expect[split][0])
            np.testing.assert_array_equal(lst.labels, expect[split][1])
    ds = build_dataset(DataConfig(str(d)), "val", eval_transform(32))
    assert len(ds) == 5 and ds[0][0].shape == (3, 32, 32) and ds[0][1] == expect["val"][1][0]

    c100 = tmp_path / "c100" / "cifar-100-python"
    c100.mkdir(parents=True)
    for name, n in (("train", 4), ("test", 3)):
        with open(c100 / name, "wb") as f:
            pickle.dump({b"fine_labels": list(range(n)), b"coarse_labels": [0] * n,
                         b"data": np.zeros((n, 3072), np.uint8)}, f, protocol=2)
    with open(c100 / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"f{i}".encode() for i in range(100)]}, f, protocol=2)
    cfg = DataConfig(str(c100.parent))
    assert inspect_source(cfg)["images"] == {"train": 4, "val": 3}
    assert inspect_source(cfg)["num_classes"] == 100


def test_cifar_loader_refuses_foreign_pickles(tmp_path):
    d, _ = _cifar10(tmp_path)
    (d / "batches.meta").write_bytes(pickle.dumps({b"label_names": os.system}, protocol=2))
    with pytest.raises(pickle.UnpicklingError, match="not a CIFAR batch"):
        open_source(DataConfig(str(d)))


def test_parquet_own_split_glob_uri_and_class_names(parquet_set, tmp_path):
    root, rows = parquet_set
    for location in (str(root), f"{root}/*.parquet", f"file://{root}"):
        cfg = DataConfig(location)
        src = open_source(cfg)
        assert src.format == "parquet" and src.own_split and src.classes == ["a", "b", "c"]
        for split in ("train", "val"):
            lst = split_list(src, cfg, split)
            assert lst.paths == [r[2] for r in rows[split]]
            assert lst.labels.tolist() == [r[1] for r in rows[split]]
            assert [lst.load(i) for i in (0, len(lst) - 1)] == [rows[split][0][0], rows[split][-1][0]]
    # no split of its own and no metadata: seeded fraction, class names from classes.json beside the shards
    flat = tmp_path / "flat"
    flat.mkdir()
    _write_parquet(flat / "part-0.parquet", rows["train"])
    (flat / "classes.json").write_text(json.dumps(["a", "b", "c"]))
    cfg = DataConfig(str(flat), val_fraction=0.25, split_seed=3)
    src = open_source(cfg)
    train, val = split_list(src, cfg, "train"), split_list(src, cfg, "val")
    assert not src.own_split and src.classes == ["a", "b", "c"]
    assert sorted(train.paths + val.paths) == sorted(r[2] for r in rows["train"]) and 3 <= len(val) <= 18
    assert split_list(src, DataConfig(str(flat), val_fraction=0.25, split_seed=3), "val").paths == val.paths


def test_augmentation_matches_torchvision_resize_and_crop_rule():
    from torchvision.transforms import v2

    from ropim.augment import CROP_RATIO, IMAGENET_MEAN, IMAGENET_STD, crop_box

    img = Image.fromarray(_pixels(30, 40, 1))
    ref = v2.Compose([v2.PILToTensor(), v2.Resize((24, 24), antialias=True), v2.ToDtype(torch.float32, scale=True),
                      v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    assert torch.allclose(eval_transform(24)(img), ref(img), atol=0.02)  # within one grey level
    rng = np.random.default_rng(0)
    boxes = np.array([crop_box(40, 30, rng.random) for _ in range(2000)])
    assert (boxes[:, :2] >= 0).all()
    assert (boxes[:, 0] + boxes[:, 2] <= 40).all() and (boxes[:, 1] + boxes[:, 3] <= 30).all()
    area, ratio = boxes[:, 2] * boxes[:, 3] / 1200, boxes[:, 2] / boxes[:, 3]
    assert area.min() > 0.6 and area.max() <= 1 and ratio.min() > 0.72 and ratio.max() < CROP_RATIO[1] + 0.05
    x = pretrain_transform(16)(img)
    assert x.shape == (3, 16, 16) and x.dtype == torch.float32


# ---------------------------------------------------------------------------------- convert and inspect


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
        want = set(split_list(open_source(cfg), cfg, split).paths) - {broken}
        assert set(split_list(open_source(out_cfg), out_cfg, split).paths) == want
    assert info["image_size"]["width"]["min"] == 16 and info["image_size"]["width"]["max"] == 32


def test_convert_cifar_keeps_pixels_and_its_own_split(tmp_path):
    d, expect = _cifar10(tmp_path)
    rep = convert(DataConfig(str(d)), str(tmp_path / "out"), shard_size=4, progress=False)
    assert rep.images == {"train": 10, "val": 5} and rep.bad_images == 0
    out_cfg = DataConfig(str(tmp_path / "out"))
    src = open_source(out_cfg)
    assert src.own_split and src.classes == [f"c{i}" for i in range(10)]
    for split in ("train", "val"):
        lst = split_list(src, out_cfg, split)
        order = np.argsort([int(p.split("_")[-1].split(".")[0]) + 100 * int(p.split("_")[1]) for p in lst.paths])
        pixels = np.stack([np.asarray(decode_rgb(lst.load(int(i)))) for i in order])
        np.testing.assert_array_equal(pixels, expect[split][0])  # PNG: lossless
        np.testing.assert_array_equal(lst.labels[order], expect[split][1])


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
    assert names == ["classes.json", "train-00000.parquet"]  # no partial shard, no temporary file
    assert pq.read_metadata(dst / "train-00000.parquet").num_rows >= 2
    (dst / ".train-00001.parquet.tmp").write_bytes(b"half a shard from a killed run")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", real_write)
    rep = convert(cfg, str(dst), shard_size=3, progress=False)
    assert rep.shards_kept == 1 and rep.shards_written == 2 and rep.images == {"train": len(good)}
    assert not [n for n in os.listdir(dst) if n.endswith(".tmp")]
    assert {p: v[1] for p, v in _read_dst(dst)["train"].items()} == good
    again = convert(cfg, str(dst), shard_size=3, progress=False)
    assert again.shards_written == 0 and again.shards_kept == 3
    other = convert(cfg, str(dst), shard_size=5, progress=False)  # another plan: stale shards replaced
    assert other.shards_written == 2 and sorted(os.listdir(dst))[1:] == ["train-00000.parquet",
                                                                         "train-00001.parquet"]


# -------------------------------------------------------------------------------------- bad data, errors


def test_corrupt_image_skipped_and_counted_under_skip_named_under_fail(folder, tmp_path):
    root, good, broken = folder
    ds = build_dataset(DataConfig(str(root), val_fraction=0.5, split_seed=1), "train")
    ds_val = build_dataset(DataConfig(str(root), val_fraction=0.5, split_seed=1), "val")
    which = ds if broken in ds.paths else ds_val
    items = [which[i] for i in range(len(which))]
    assert which.bad.count == 1 and which.bad.paths == [broken]
    assert all(img.mode == "RGB" for img, _ in items)

    fail = DataConfig(str(root), val_fraction=0.5, split_seed=1, on_bad_image="fail")
    which = build_dataset(fail, "train" if which is ds else "val")
    with pytest.raises(BadImageError, match="broken.jpg"):
        [which[i] for i in range(len(which))]
    with pytest.raises(BadImageError, match="broken.jpg"):
        convert(fail, str(tmp_path / "out"), shard_size=100, progress=False)
    assert not [n for n in os.listdir(tmp_path / "out") if n.endswith((".parquet", ".tmp"))]


def test_missing_empty_and_imageless_sources_raise_one_clear_error(tmp_path, parquet_set):
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimg" / "cls").mkdir(parents=True)
    (tmp_path / "noimg" / "cls" / "a.txt").write_text("x")
    (tmp_path / "loose").mkdir()
    Image.fromarray(_pixels(4, 4, 0)).save(tmp_path / "loose" / "a.png")
    (tmp_path / "nopq").mkdir()
    pq.write_table(pa.table({"image": pa.array([], pa.binary()), "label": pa.array([], pa.int64())}),
                   tmp_path / "nopq" / "train-0.parquet")
    (tmp_path / "nolabel").mkdir()
    pq.write_table(pa.table({"image": [b"x"]}), tmp_path / "nolabel" / "x.parquet")
    cases = {
        tmp_path / "missing": "no such file or folder",
        tmp_path / "empty": "no images",
        tmp_path / "noimg": "no images",
        tmp_path / "loose": "no class folders",
        tmp_path / "nopq": "no rows",
        tmp_path / "nolabel": "no label column",
        f"{tmp_path}/nothing-*.parquet": "no Parquet files",
    }
    for path, message in cases.items():
        with pytest.raises(ConfigError, match=message) as err:
            DataConfig(str(path)).validate()
        assert str(path) in str(err.value)
    with pytest.raises(ConfigError, match="val_fraction"):
        DataConfig(val_fraction=1.5).validate()
    with pytest.raises(SystemExit, match="ropim data inspect: .*no such file"):
        cli_main(["data", "inspect", str(tmp_path / "missing")])


def test_cli_convert_then_inspect(parquet_set, tmp_path, capsys):
    root, rows = parquet_set
    cli_main(["data", "convert", str(root), str(tmp_path / "out"), "--shard-size", "16"])
    assert "train 40  val 10 images" in capsys.readouterr().out
    cli_main(["data", "inspect", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert "parquet" in out and "train 40  val 10" in out and "classes     3: a, b, c" in out
    assert sorted(os.listdir(tmp_path / "out")) == ["classes.json", "train-00000.parquet", "train-00001.parquet",
                                                     "train-00002.parquet", "val-00000.parquet"]


# ------------------------------------------------------------------------------------------- Ray Data


def test_ray_dataset_decodes_every_format_and_counts_bad_images(ray_session, folder, parquet_set, tmp_path):
    from ropim.ingest import bad_image_summary, build_ray_dataset, new_bad_image_counter

    root, rows = parquet_set
    batch = build_ray_dataset(DataConfig(str(root)), "val", 32, shuffle_seed=None).take_batch(100)
    assert batch["image"].shape == (10, 3, 32, 32) and batch["image"].dtype == np.float32
    assert sorted(batch["label"].tolist()) == sorted(r[1] for r in rows["val"])
    d, expect = _cifar10(tmp_path)
    batch = build_ray_dataset(DataConfig(str(d)), "train", 32).take_batch(100)
    assert batch["image"].shape == (10, 3, 32, 32) and sorted(batch["label"]) == sorted(expect["train"][1])

    froot, good, broken = folder
    counter = new_bad_image_counter()
    cfg = DataConfig(str(froot), val_fraction=0.5, split_seed=1)
    n = sum(len(b["label"]) for s in ("train", "val")
            for b in build_ray_dataset(cfg, s, 16, bad_images=counter).iter_batches(batch_size=None))
    assert n == len(good) and bad_image_summary(counter) == {"count": 1, "paths": [broken]}
    fail = DataConfig(str(froot), val_fraction=0.5, split_seed=1, on_bad_image="fail")
    with pytest.raises(Exception, match="broken.jpg: cannot decode image"):  # fails fast: no retries
        for s in ("train", "val"):
            build_ray_dataset(fail, s, 16).take_all()


def test_two_worker_trainer_reads_parquet_through_ray_data_on_two_cpus(ray_session, parquet_set, tmp_path):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ropim.ingest import build_ray_dataset, resources_per_worker

    def train_loop(config):  # nested: Ray pickles it by value
        import ray.train

        from ropim.ingest import iter_epoch

        ctx = ray.train.get_context()
        shard = ray.train.get_dataset_shard("train")
        batches = 0
        for images, labels in iter_epoch(shard, batch_size=4, epoch=0, seed=0, rank=ctx.get_world_rank()):
            assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and labels.dtype == torch.int64
            batches += 1
            if batches == 2:
                break
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if ctx.get_world_rank() == 0:
                open(os.path.join(tmp, "done"), "w").close()
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"batches": batches}, checkpoint=ckpt)

    root, _ = parquet_set
    assert resources_per_worker(2) == {"CPU": 0.5}  # ray_session declares 2 CPUs
    trainer = TorchTrainer(
        train_loop,
        datasets={"train": build_ray_dataset(DataConfig(str(root)), "train", 32)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker=resources_per_worker(2)),
        run_config=RunConfig(name="ingest", storage_path=str(tmp_path)),
    )

    def hung(*_):
        raise TimeoutError("TorchTrainer with Ray Data did not finish in 240 s: the 2-CPU hang is back")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(240)
    try:
        result = trainer.fit()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert result.metrics["batches"] == 2
