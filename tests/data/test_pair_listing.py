"""What a folder-pair listing leaves out, and says so: a pair whose image is listed already (a link to it), and a
mask or image of a type that is not read (TIFF), which the listing and the decoder refuse alike."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ropim.data.config import SegDataConfig
from ropim.data.decode import decode_mask
from ropim.data.sources import open_source
from ropim.errors import ConfigError


def write_pairs(root: Path, n: int = 3, mask_ext: str = "png") -> Path:
    """ROOT/images/p<i>.png + ROOT/masks/p<i>.<mask_ext> (labels 0..2), three named classes."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    (root / "classes.json").write_text(json.dumps(["a", "b", "c"]))
    for i in range(n):
        Image.new("RGB", (16, 12)).save(root / "images" / f"p{i}.png")
        Image.fromarray(np.full((12, 16), i % 3, np.uint8)).save(root / "masks" / f"p{i}.{mask_ext}", lossless=True)
    return root


def listed(root: Path, **kw):
    src = open_source(SegDataConfig(source=str(root), **kw))
    return src.split(None), src.notes


def test_a_pair_whose_image_is_listed_already_is_left_out_and_noted(tmp_path):
    """A link to an image listed under another name dropped its pair's mask (another mask) without a word."""
    root = write_pairs(tmp_path / "set")
    assert listed(root)[1] == []
    os.symlink("p0.png", root / "images" / "p9.png")
    Image.fromarray(np.full((12, 16), 2, np.uint8)).save(root / "masks" / "p9.png")
    pairs, notes = listed(root)
    assert pairs.paths == ["images/p0.png", "images/p1.png", "images/p2.png"] and pairs.masks[0] == "masks/p0.png"
    assert notes == ["1 pair(s) left out: their image is one listed already (e.g. images/p9.png is images/p0.png, "
                     "through a link); images/p0.png's pair is kept, images/p9.png and its mask masks/p9.png left "
                     "out; copy the image to keep both pairs, or remove the link"]


def test_an_image_linked_into_both_splits_is_kept_in_train_and_noted(tmp_path):
    root = tmp_path / "split"
    for split, name in (("train", "t"), ("val", "v")):
        (root / "images" / split).mkdir(parents=True)
        (root / "masks" / split).mkdir(parents=True)
        Image.new("RGB", (16, 12)).save(root / "images" / split / f"{name}.png")
        Image.fromarray(np.zeros((12, 16), np.uint8)).save(root / "masks" / split / f"{name}.png")
    (root / "images" / "val" / "w.png").symlink_to(root / "images" / "train" / "t.png")
    Image.fromarray(np.ones((12, 16), np.uint8)).save(root / "masks" / "val" / "w.png")
    src = open_source(SegDataConfig(source=str(root), num_classes=2))
    assert src.split("train").paths == ["images/train/t.png"] and src.split("val").paths == ["images/val/v.png"]
    assert src.notes == ["1 pair(s) left out: their image is one listed already (e.g. images/val/w.png is "
                         "images/train/t.png, through a link); images/train/t.png's pair is kept, images/val/w.png "
                         "and its mask masks/val/w.png left out; copy the image to keep both pairs, or remove the "
                         "link"]


@pytest.mark.parametrize("ext", ["tif", "tiff", "TIF"])
def test_tiff_masks_are_refused_naming_the_file_not_as_missing(tmp_path, ext):
    """The decoder reads no TIFF and the listing skipped them: 'no masks' / 'has no mask', with the mask right there."""
    root = write_pairs(tmp_path / "all", mask_ext=ext)
    with pytest.raises(ConfigError, match=rf"all/masks/p0\.{ext} is not read, so .*all/images/p0\.png has no mask: "
                                          rf"images and masks are read only as \.jpg/.*/\.gif files, not \.{ext}; "
                                          r"save it as a greyscale \('L'\) or palette \('P'\) PNG"):
        listed(root)
    root = write_pairs(tmp_path / "one")
    (root / "masks" / "p2.png").rename(root / "masks" / f"p2.{ext}")
    with pytest.raises(ConfigError, match=rf"one/masks/p2\.{ext} is not read, so .*one/images/p2\.png has no mask"):
        listed(root)
    buf = io.BytesIO()
    Image.fromarray(np.zeros((12, 16), np.uint8)).save(buf, format="TIFF")
    with pytest.raises(ValueError, match="mask m.tif: cannot identify image file"):
        decode_mask(buf.getvalue(), "m.tif")


def test_a_tiff_image_is_refused_naming_it_and_webp_masks_are_read(tmp_path):
    root = write_pairs(tmp_path / "img")
    Image.open(root / "images" / "p1.png").save(root / "images" / "p1.tif")
    (root / "images" / "p1.png").unlink()
    with pytest.raises(ConfigError, match=r"img/images/p1\.tif is not read, so .*img/masks/p1\.png has no image: .*; "
                                          "save it as PNG$"):
        listed(root)
    (root / "masks" / "p1.txt").write_text("notes")  # another file beside a complete pair is nobody's business
    (root / "images" / "p1.png").write_bytes((root / "images" / "p0.png").read_bytes())
    assert len(listed(root)[0]) == 3
    pairs, _ = listed(write_pairs(tmp_path / "webp", mask_ext="webp"))
    assert [pairs.load(i)[1].max() for i in range(3)] == [0, 1, 2]
