"""An ImageFolder as people make them: 16-bit PNGs, upper-case extensions, links (to another class, another split,
outside the folder), an empty class folder; what `ropim data inspect` and the readers make of each."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest
from PIL import Image
from sample_data import pixels

from ropim.cli import main as cli_main
from ropim.data.config import DataConfig
from ropim.data.convert import convert
from ropim.data.datasets import build_dataset
from ropim.data.decode import decode_rgb
from ropim.data.inspect import format_summary, inspect_source
from ropim.data.sources import open_source


def test_a_16_bit_png_keeps_its_picture(tmp_path):
    """A 16-bit greyscale PNG became almost white (PIL's convert clips at 255); now its top 8 bits, in the folder
    and in its Parquet conversion."""
    deep = np.random.default_rng(0).integers(0, 65536, (12, 12)).astype(np.uint16)
    (tmp_path / "pics" / "a").mkdir(parents=True)
    Image.fromarray(deep).save(tmp_path / "pics" / "a" / "deep.png")
    Image.fromarray(pixels(12, 12, 1)).save(tmp_path / "pics" / "a" / "UPPER.PNG")
    want = np.repeat((deep >> 8).astype(np.uint8)[..., None], 3, axis=2)
    ds = build_dataset(DataConfig(str(tmp_path / "pics"), val_fraction=0.01), "train")
    got = {p: np.asarray(ds[i][0]) for i, p in enumerate(ds.paths)}
    assert set(got) == {"a/deep.png", "a/UPPER.PNG"} and np.array_equal(got["a/deep.png"], want)
    convert(DataConfig(str(tmp_path / "pics")), str(tmp_path / "out"), progress=False)
    shards = open_source(DataConfig(str(tmp_path / "out"))).split(None)
    i = shards.paths.index("a/deep.png")
    assert np.array_equal(np.asarray(decode_rgb(shards.load(i))), want)


def test_a_bad_image_line_names_no_memory_address(tmp_path, caplog):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_text("not an image")
    Image.fromarray(pixels(8, 8, 1)).save(tmp_path / "a" / "y.png")
    ds = build_dataset(DataConfig(str(tmp_path), val_fraction=0.01), "train")
    with caplog.at_level(logging.WARNING, logger="ropim"):
        [ds[i] for i in range(len(ds))]
    assert "skipping undecodable image a/x.png (cannot identify image file)" in caplog.text


def test_a_link_to_an_image_of_another_class_or_split_lists_it_once(tmp_path):
    """A link inside the folder to an image listed elsewhere gave it twice: in two classes, or in train and val
    (the same picture scored against itself)."""
    root = tmp_path / "split"
    for split, rel, seed in (("train", "cat/t.png", 1), ("train", "dog/d.png", 2), ("val", "cat/v.png", 3),
                             ("val", "dog/w.png", 4)):
        (root / split / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels(8, 8, seed)).save(root / split / rel)
    (root / "train" / "cat" / "peek.png").symlink_to(root / "val" / "cat" / "v.png")
    (root / "train" / "dog" / "also.png").symlink_to(root / "train" / "cat" / "t.png")
    src = open_source(DataConfig(str(root)))
    listed = {s: src.split(s).paths for s in ("train", "val")}
    real = [os.path.realpath(root / p) for s in listed.values() for p in s]
    assert len(real) == len(set(real)) == 4, listed
    assert src.notes == ["2 image(s) listed once though reached twice (e.g. train/dog/also.png is train/cat/t.png, "
                         "through a link): the first met is kept, so that a picture is in one class and one split; "
                         "copy the image to keep both"]  # before: left out without a word


def test_links_to_images_outside_the_folder_are_named_not_silently_dropped(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "raw").mkdir()
    for k in range(4):
        Image.fromarray(pixels(8, 8, k)).save(tmp_path / "raw" / f"{k}.png")
    for k, c in enumerate("aabb"):
        (tmp_path / "farm" / c).mkdir(parents=True, exist_ok=True)
        (tmp_path / "farm" / c / f"{k}.png").symlink_to(tmp_path / "raw" / f"{k}.png")
    with pytest.raises(SystemExit, match=r"farm': no image inside it: 4 symbolic links lead outside the source \(e.g. "
                                         r"a/0.png -> .*raw/0.png\) and are not followed; --data.follow_links true"):
        cli_main(["data", "inspect", "farm"])
    for k, c in enumerate("aabbaabb"):
        Image.fromarray(pixels(8, 8, 10 + k)).save(tmp_path / "farm" / c / f"real{k}.png")
    (tmp_path / "farm" / "empty").mkdir()
    cli_main(["data", "inspect", "farm"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note")]
    assert notes[0].startswith("note        4 symbolic links lead outside the source (e.g. a/0.png -> ")
    assert notes[1] == ("note        1 of the 3 classes hold no image (empty): a classifier gets an output it never "
                        "learns; remove such folders if they are not classes")


def test_a_subset_linked_into_a_larger_set_is_read_with_follow_links(tmp_path, monkeypatch, capsys):
    """ImageNet-100 is usually made as class-folder links into ImageNet-1k (and file links): refused by default,
    naming the flag; with it every linked image is listed once (a class linked twice, or a cycle, adds nothing)."""
    monkeypatch.chdir(tmp_path)
    for c in ("n01", "n02", "n03"):
        (tmp_path / "big" / "train" / c).mkdir(parents=True)
        for k in range(3):
            Image.fromarray(pixels(8, 8, k)).save(tmp_path / "big" / "train" / c / f"{c}_{k}.png")
    (tmp_path / "big" / "train" / "n01" / "loop").symlink_to(tmp_path / "big" / "train" / "n01")  # a cycle
    (tmp_path / "sub" / "train" / "n03").mkdir(parents=True)
    os.symlink("../../big/train/n01", "sub/train/n01")  # relative, as `ln -s` is often used
    (tmp_path / "sub" / "train" / "n02").symlink_to(tmp_path / "big" / "train" / "n02")
    (tmp_path / "sub" / "train" / "n03" / "one.png").symlink_to(tmp_path / "big" / "train" / "n03" / "n03_0.png")
    with pytest.raises(SystemExit, match=r"sub': no image inside it: 3 symbolic links lead outside the source "
                                         r"\(e.g. train/n01 -> .*big/train/n01\)"):
        cli_main(["data", "inspect", "sub"])
    cli_main(["data", "inspect", "sub", "--follow-links", "true", "--val-fraction", "0.25"])
    assert "images      train 6  val 1" in capsys.readouterr().out  # n01: 3, n02: 3, n03: 1; n01's loop adds none
    src = open_source(DataConfig("sub", follow_links=True).resolved().validate())
    listed = src.split(None)
    real = [os.path.realpath(tmp_path / "sub" / p) for p in listed.paths]
    assert len(real) == len(set(real)) == 7 and listed.classes == ["n01", "n02", "n03"]
    with pytest.raises(Exception, match="follow_links"):
        DataConfig("sub").resolved().validate()


def test_inspect_of_a_plain_folder_has_no_notes(folder):
    root, _, _ = folder
    info = inspect_source(DataConfig(str(root)))
    assert info["notes"] == [] and "note" not in format_summary(info)


def test_data_commands_take_the_pixel_guard(tmp_path, monkeypatch, capsys):
    """`ropim data inspect|convert --max-pixels` is the jobs' data.max_pixels: images above it are bad images."""
    monkeypatch.chdir(tmp_path)
    for c, size in (("a", 8), ("b", 16)):
        (tmp_path / "pics" / c).mkdir(parents=True)
        for k in range(2):
            Image.fromarray(pixels(size, size, k)).save(tmp_path / "pics" / c / f"{k}.png")
    cli_main(["data", "inspect", "pics", "--max-pixels", "100"])
    assert "undecodable 2 of 4 sampled" in capsys.readouterr().out  # the 16×16 images: 256 pixels > 100
    cli_main(["data", "convert", "pics", "out", "--max-pixels", "100"])
    assert "bad images skipped 2" in capsys.readouterr().out


def test_image_files_of_types_not_read_are_named(tmp_path, capsys):
    """TIFF images (microscopes, satellites) beside JPEGs: left out of the listing, as before, and now named by
    `ropim data inspect` with the fix; a folder of TIFFs alone is refused naming them, not as a folder of no images."""
    mixed = tmp_path / "mixed"
    for c in ("a", "b"):
        (mixed / c).mkdir(parents=True)
        Image.fromarray(pixels(8, 8, 1)).save(mixed / c / "0.png")
        Image.fromarray(pixels(8, 8, 2)).save(mixed / c / "1.tif")
    (mixed / "a" / "2.TIFF").write_bytes((mixed / "a" / "1.tif").read_bytes())
    (mixed / "a" / "notes.txt").write_text("not an image")
    cli_main(["data", "inspect", str(mixed)])
    out = capsys.readouterr().out
    assert ("note        3 image files of types not read are left out (2 .tif, 1 .tiff): images are read as "
            ".jpg/.jpeg/.png/.webp/.bmp/.gif files; save them as PNG to use them") in out, out
    only = tmp_path / "only-tiff"
    (only / "a").mkdir(parents=True)
    Image.fromarray(pixels(8, 8, 1)).save(only / "a" / "0.tif")
    with pytest.raises(SystemExit, match=r"only-tiff': no image it reads: 1 image files of types not read are left "
                                         r"out \(1 \.tif\): images are read as \.jpg/"):
        cli_main(["data", "inspect", str(only)])


def test_a_class_folder_that_cannot_be_listed_is_named_not_silently_dropped(tmp_path, monkeypatch, capsys, caplog):
    """A class folder with no read permission, or on a stale NFS mount, gave no image and no word: a job trained
    without that class's images. Now inspect names it and a job's pre-flight warns (root reads through modes, so
    the test makes scandir fail where a user's permissions would)."""
    from ropim.data.sources import check_batch_fits, one_listing

    monkeypatch.chdir(tmp_path)
    for c in ("a", "b", "c"):
        (tmp_path / "pics" / c).mkdir(parents=True)
        for k in range(4):
            Image.fromarray(pixels(8, 8, k)).save(tmp_path / "pics" / c / f"{k}.png")
    scandir = os.scandir

    def denied(path):
        if os.path.basename(str(path)) == "b":
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", denied)
    cli_main(["data", "inspect", "pics"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note")]
    assert notes[0] == ("note        1 folder(s) or link(s) could not be read and their images are left out (e.g. b: "
                        "Permission denied); make them readable to use them")
    (tmp_path / "pics" / "c" / "gone.png").symlink_to(tmp_path / "deleted.png")  # a link to a file removed since
    cli_main(["data", "inspect", "pics"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note")]
    assert notes[0].startswith("note        2 folder(s) or link(s) could not be read")
    caplog.set_level(logging.WARNING, logger="ropim.data")
    with one_listing():
        assert check_batch_fits(DataConfig("pics", val_fraction=0.25), {"global_batch_size": 4}) == 6
    assert [r.getMessage() for r in caplog.records] == [f"data source pics: {notes[0].removeprefix('note        ')}"]


def test_a_file_name_that_is_not_utf8_is_named_not_a_traceback(tmp_path, monkeypatch, capsys):
    """A name in another encoding (Latin-1 from an old archive): Python lists it with surrogates, which a path
    column cannot hold; every listing (inspect, jobs, convert) ended in pyarrow's UnicodeEncodeError traceback."""
    monkeypatch.chdir(tmp_path)
    for c in ("a", "b"):
        (tmp_path / "pics" / c).mkdir(parents=True)
        for k in range(4):
            Image.fromarray(pixels(8, 8, k)).save(tmp_path / "pics" / c / f"{k}.png")
    os.rename(b"pics/a/0.png", b"pics/a/caf\xe9.png")
    cli_main(["data", "inspect", "pics"])
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note")]
    assert notes == ["note        1 file(s) or folder(s) whose names are not valid UTF-8 are left out (e.g. "
                     "a/caf\\xe9.png); rename them to use them"]
    src = open_source(DataConfig("pics", val_fraction=0.25))
    assert len(src.split("train")) + len(src.split("val")) == 7  # the others listed
