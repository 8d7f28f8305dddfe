"""Every source format read back exactly, the split rule, the augmentation, and clear errors for bad sources."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from sample_data import cifar10, encode, pixels, write_parquet

from ropim.cli import main as cli_main
from ropim.data.config import DataConfig
from ropim.data.convert import convert
from ropim.data.datasets import build_dataset, eval_transform, pretrain_transform
from ropim.data.decode import BadImageError, decode_rgb
from ropim.data.inspect import format_summary, inspect_source
from ropim.data.sources import check_batch_fits, count_images, open_source
from ropim.errors import ConfigError


def test_imagefolder_lists_every_image_with_its_label_and_decodes_to_rgb(folder):
    root, good, broken = folder
    cfg = DataConfig(str(root))
    src = open_source(cfg)
    assert src.format == "imagefolder" and src.classes == ["cat", "dog"] and not src.own_split
    everything = src.split(None)
    assert dict(zip(everything.paths, everything.labels.tolist(), strict=True)) == {**good, broken: 1}
    train, val = src.split("train"), src.split("val")
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
                Image.fromarray(pixels(8, 8, i)).save(tmp_path / split / c / f"{i}.png")
    cfg = DataConfig(str(tmp_path))
    src = open_source(cfg)
    assert src.own_split and src.classes == ["x", "y"]
    val = src.split("val")
    assert len(src.split("train")) == 6 and len(val) == 4
    assert sorted(zip(val.paths, val.labels.tolist(), strict=True))[0] == ("val/x/0.png", 0)


def test_cifar10_and_cifar100_official_layouts(tmp_path):
    d, expect = cifar10(tmp_path)
    for location in (d, tmp_path):  # the batches folder itself, or its parent
        cfg = DataConfig(str(location))
        src = open_source(cfg)
        assert src.format == "cifar" and src.own_split and src.classes == [f"c{i}" for i in range(10)]
        for split in ("train", "val"):
            lst = src.split(split)
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
    d, _ = cifar10(tmp_path)
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
            lst = src.split(split)
            assert lst.paths == [r[2] for r in rows[split]]
            assert lst.labels.tolist() == [r[1] for r in rows[split]]
            assert [lst.load(i) for i in (0, len(lst) - 1)] == [rows[split][0][0], rows[split][-1][0]]
    # no split of its own and no metadata: seeded fraction, class names from classes.json beside the shards
    flat = tmp_path / "flat"
    flat.mkdir()
    write_parquet(flat / "part-0.parquet", rows["train"])
    (flat / "classes.json").write_text(json.dumps(["a", "b", "c"]))
    cfg = DataConfig(str(flat), val_fraction=0.25, split_seed=3)
    src = open_source(cfg)
    train, val = src.split("train"), src.split("val")
    assert not src.own_split and src.classes == ["a", "b", "c"]
    assert sorted(train.paths + val.paths) == sorted(r[2] for r in rows["train"]) and 3 <= len(val) <= 18
    assert open_source(DataConfig(str(flat), val_fraction=0.25, split_seed=3)).split("val").paths == val.paths


def test_augmentation_matches_torchvision_resize_and_crop_rule():
    from torchvision.transforms import v2

    from ropim.data.augment import CROP_RATIO, IMAGENET_MEAN, IMAGENET_STD, crop_box

    img = Image.fromarray(pixels(30, 40, 1))
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


@pytest.mark.parametrize("width, height", [(500, 375), (375, 500), (300, 300), (1000, 200)])
def test_evaluation_over_32_pixels_is_the_official_resize_and_centre_crop(width, height):
    """The official fine-tuning's evaluation (TEST.CROP): short side to 256/224 of the size, bicubic, centre crop;
    the whole image stretched to 224×224 changed every non-square image's proportions."""
    from torchvision.transforms import v2

    from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8))
    ref = v2.Compose([v2.Resize(256, interpolation=v2.InterpolationMode.BICUBIC), v2.CenterCrop(224),  # on the PIL
                      v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True),
                      v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    assert torch.allclose(eval_transform(224)(img), ref(img), atol=1e-5)  # the same pixels


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
    assert not (tmp_path / "out").exists()  # the failed run leaves no trace


def test_missing_empty_and_imageless_sources_raise_one_clear_error(tmp_path, parquet_set):
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimg" / "cls").mkdir(parents=True)
    (tmp_path / "noimg" / "cls" / "a.txt").write_text("x")
    (tmp_path / "loose").mkdir()
    Image.fromarray(pixels(4, 4, 0)).save(tmp_path / "loose" / "a.png")
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


def test_untrusted_images_decode_only_known_formats_under_a_pixel_limit(tmp_path):
    """Only JPEG/PNG/WebP/BMP/GIF decoders run; a small file declaring a huge image is a bad image from its header."""
    tiff = encode(Image.fromarray(pixels(8, 8, 0)), "TIFF")
    with pytest.raises(Exception, match="cannot identify image file"):
        decode_rgb(tiff)
    bomb = encode(Image.new("L", (6000, 6000)), "PNG")  # ~40 KB on disk, 36 MP once decoded
    assert len(bomb) < 100_000
    with pytest.raises(ValueError, match="6000x6000 = 36,000,000 pixels, over data.max_pixels=25,000,000"):
        decode_rgb(bomb)
    assert decode_rgb(bomb, max_pixels=40_000_000).size == (6000, 6000)
    root = tmp_path / "imgs"
    for name, data in (("a.png", encode(Image.fromarray(pixels(8, 8, 1)), "PNG")), ("bomb.png", bomb),
                       ("b.gif", encode(Image.fromarray(pixels(8, 8, 2)).convert("P"), "GIF"))):
        (root / "c").mkdir(parents=True, exist_ok=True)
        (root / "c" / name).write_bytes(data)
    ds = build_dataset(DataConfig(str(root), val_fraction=0.01), "train")
    items = [ds[i] for i in range(len(ds))]
    assert ds.bad.paths == ["c/bomb.png"] and all(img.size == (8, 8) for img, _ in items)  # policy: skipped
    with pytest.raises(BadImageError, match="bomb.png: cannot decode image .*over data.max_pixels"):
        failing = build_dataset(DataConfig(str(root), val_fraction=0.01, on_bad_image="fail"), "train")
        [failing[i] for i in range(len(failing))]


def test_symlinks_are_followed_inside_the_root_once_and_never_outside(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.fromarray(pixels(8, 8, 9)).save(outside / "secret.png")
    root = tmp_path / "root"
    (root / "cat" / "sub").mkdir(parents=True)
    (root / "dog").mkdir()
    Image.fromarray(pixels(8, 8, 1)).save(root / "cat" / "c.png")
    Image.fromarray(pixels(8, 8, 2)).save(root / "dog" / "d.png")
    (root / "cat" / "sub" / "loop").symlink_to(root / "cat")  # a cycle
    (root / "cat" / "again.png").symlink_to(root / "cat" / "c.png")  # the same file twice
    (root / "dog" / "leak").symlink_to(outside)  # outside the data set
    (root / "dog" / "leak.png").symlink_to(outside / "secret.png")
    listed = open_source(DataConfig(str(root))).split(None)
    assert sorted(listed.paths) == ["cat/again.png", "dog/d.png"] or sorted(listed.paths) == ["cat/c.png",
                                                                                             "dog/d.png"]


def test_parquet_labels_must_be_class_indices(tmp_path):
    img = encode(Image.fromarray(pixels(8, 8, 0)), "PNG")
    (tmp_path / "strings").mkdir()
    pq.write_table(pa.table({"image": [img], "label": ["cat"]}), tmp_path / "strings" / "train-0.parquet")
    with pytest.raises(ConfigError, match="label column holds string, not integers"):
        DataConfig(str(tmp_path / "strings")).validate()
    (tmp_path / "range").mkdir()
    write_parquet(tmp_path / "range" / "train-0.parquet", [(img, 5, "a.png"), (img, 0, "b.png")], ["x", "y", "z"])
    with pytest.raises(ConfigError, match="has labels 0..5, outside the 3 classes"):
        build_dataset(DataConfig(str(tmp_path / "range")), "train")


def png(size: tuple[int, int] = (20, 10)) -> bytes:
    """A black PNG."""
    import io

    out = io.BytesIO()
    Image.new("RGB", size).save(out, "PNG")
    return out.getvalue()


def test_inspect_decodes_its_sample_and_counts_the_images_that_do_not(tmp_path):
    (tmp_path / "mixed").mkdir()
    images = [b"not an image" if i % 5 == 0 else png() for i in range(50)]  # 10 of 50 bad
    pq.write_table(pa.table({"image": images, "label": pa.array([i % 2 for i in range(50)], pa.int64()),
                             "path": [f"m/{i}.png" for i in range(50)]}), tmp_path / "mixed" / "train-0.parquet")
    cfg = DataConfig(str(tmp_path / "mixed"))
    info = inspect_source(cfg)
    assert info["undecodable"]["sampled"] == 50 and info["undecodable"]["count"] == 10
    assert info["image_size"]["sampled"] == 40
    assert "undecodable 10 of 50 sampled (first: m/0.png: cannot identify image file)" in format_summary(info)
    assert check_batch_fits(cfg, {"batch_size": 8}) == info["images"]["train"]  # some bad images: pre-flight passes


def test_preflight_sample_reads_one_row_group_of_the_first_shard(tmp_path):
    (tmp_path / "groups").mkdir()
    schema = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("path", pa.string())])
    with pq.ParquetWriter(tmp_path / "groups" / "train-0.parquet", schema) as writer:
        for g in range(3):  # row groups of 4: the first all bad, the others good
            writer.write_table(pa.table({"image": [b"x" if g == 0 else png()] * 4, "label": [0] * 4,
                                         "path": [f"{g}/{i}.png" for i in range(4)]}, schema=schema))
    cfg = DataConfig(str(tmp_path / "groups"), val_fraction=0.01)
    images = open_source(cfg).split("train")
    assert [p for p, _ in images.head(8)] == [p for p in images.paths if p.startswith("0/")]
    with pytest.raises(ConfigError, match=r"groups'?: none of the first \d images of the training split decodes"):
        check_batch_fits(cfg, {"batch_size": 1})


def test_a_shard_damaged_inside_stops_training_naming_it_instead_of_skipping_its_images(tmp_path):
    for k in range(2):
        rows = [(encode(Image.fromarray(pixels(8, 8, i)), "PNG"), i % 2, f"s{k}/img{i}.png") for i in range(40)]
        write_parquet(tmp_path / f"train-{k:05d}.parquet", rows, classes=["a", "b"])
    damaged = tmp_path / "train-00001.parquet"
    image = pq.ParquetFile(damaged).metadata.row_group(0).column(0)  # the image column's pages
    start, size = image.dictionary_page_offset or image.data_page_offset, image.total_compressed_size
    data = bytearray(damaged.read_bytes())
    data[start:start + size] = bytes(size)  # zeroed, as a disk fault might; the labels and the footer stay whole
    damaged.write_bytes(bytes(data))
    ds = build_dataset(DataConfig(str(tmp_path), val_fraction=0.2), "train", eval_transform(16))
    assert ds[ds.paths.index(next(p for p in ds.paths if p.startswith("s0/")))] is not None  # a whole shard's
    with pytest.raises(ConfigError, match=r"train-00001\.parquet cannot be read as Parquet .*delete it and run the "
                                          r"same `ropim data convert` again"):
        for i in range(len(ds)):
            ds[i]
    assert ds.bad.count == 0  # not counted as bad images: the run stops on the damaged file


def test_hugging_face_parquet_images_and_class_labels_are_read(tmp_path):
    """A Hugging Face ``datasets`` export: ``image`` a struct of bytes and path, the class names a ClassLabel's."""
    images = [encode(Image.fromarray(pixels(8, 8, i)), "PNG") for i in range(30)]
    column = pa.array([{"bytes": b, "path": f"{i}.png"} for i, b in enumerate(images)],
                      pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    features = {"image": {"_type": "Image"}, "label": {"names": ["cat", "dog", "fox"], "_type": "ClassLabel"}}
    table = pa.table({"image": column, "label": pa.array([i % 3 for i in range(30)], pa.int64())})
    (tmp_path / "data").mkdir()
    for split, rows in (("train", slice(0, 24)), ("validation", slice(24, 30))):
        pq.write_table(table.slice(rows.start, rows.stop - rows.start).replace_schema_metadata(
            {b"huggingface": json.dumps({"info": {"features": features}}).encode()}),
            tmp_path / "data" / f"{split}-00000-of-00001.parquet")
    src = open_source(DataConfig(str(tmp_path / "data")))
    assert src.own_split and src.classes == ["cat", "dog", "fox"]
    assert len(src.split("train")) == 24 and len(src.split("val")) == 6
    unlabelled = table.slice(0, 4).set_column(1, "label", pa.array([-1] * 4, pa.int64()))  # its test split
    pq.write_table(unlabelled.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}})}),
                   tmp_path / "data" / "test-00000-of-00001.parquet")
    src = open_source(DataConfig(str(tmp_path / "data")))  # left out beside validation-*: no -1 label listed
    assert src.classes == ["cat", "dog", "fox"] and len(src.split("train")) == 24
    assert src.split("val").labels.tolist() == [i % 3 for i in range(24, 30)]
    ds = build_dataset(DataConfig(str(tmp_path / "data")), "val")
    assert [np.asarray(ds[i][0]).tolist() for i in range(6)] == [pixels(8, 8, i).tolist() for i in range(24, 30)]
    assert ds.bad.count == 0
    pq.write_table(pa.table({"image": pa.array([1, 2]), "label": pa.array([0, 1])}), tmp_path / "ints.parquet")
    with pytest.raises(ConfigError, match=r"ints\.parquet's image column holds int64, not encoded images"):
        DataConfig(str(tmp_path / "ints.parquet")).validate()
