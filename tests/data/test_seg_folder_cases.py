"""Segmentation folders as people make them: palette (Pascal VOC), 16-bit, greyscale-as-RGB, colour-coded and JPEG
masks, upper-case extensions, two files of one stem, split folders on one side only, an empty masks/ folder, links
out of the folder and inside it, a mask cut short, too many classes; what `ropim data inspect|convert --task segment`
and the readers make of each, from the folder the user works in (relative paths)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support import run_cli_here

from ropim.data.config import SegDataConfig
from ropim.data.sources import open_source
from ropim.errors import ConfigError

CLASSES = ["bg", "road", "car", "sky"]
VOC = [0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [0, 0, 0] * 251 + [224, 224, 192]  # 255: the border colour


def labels(i: int, h: int = 12, w: int = 16) -> np.ndarray:
    """Pair ``i``'s class indices: background, class 1 + i % 3 on the right, a row of 255 (ignore)."""
    m = np.zeros((h, w), np.uint8)
    m[:, w // 3:] = 1 + i % 3
    m[h // 2] = 255
    return m


def palette(m: np.ndarray) -> Image.Image:
    """``m`` as a palette PNG (Pascal VOC's way: the index is the class, the palette only its colour)."""
    img = Image.frombytes("P", (m.shape[1], m.shape[0]), m.tobytes())
    img.putpalette(VOC)
    return img


def rgb(m: np.ndarray) -> Image.Image:
    """``m`` painted in the palette's colours: a colour-coded mask."""
    return Image.fromarray(np.array(VOC, np.uint8).reshape(256, 3)[m])


def with_alpha(m: np.ndarray, alpha: np.ndarray) -> Image.Image:
    """``m`` as a greyscale + alpha ('LA') image."""
    return Image.fromarray(np.stack([m, alpha.astype(np.uint8)], -1), "LA")


def write_pairs(root: Path, n: int = 8, mask=Image.fromarray, mask_ext: str = "png", image_ext: str = "png",
                classes: list[str] | None = CLASSES) -> Path:
    """ROOT/images/p<i>.<image_ext> + ROOT/masks/p<i>.<mask_ext> (``mask``: labels → PIL image), classes.json."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8)).save(root / "images" / f"p{i}.{image_ext}")
        mask(labels(i)).save(root / "masks" / f"p{i}.{mask_ext}", format="JPEG" if mask_ext == "jpg" else None)
    if classes:
        (root / "classes.json").write_text(json.dumps(classes))
    return root


def read_all(source: str, **kw) -> dict[str, np.ndarray]:
    """{image path: label map} of every pair of ``source``."""
    pairs = open_source(SegDataConfig(source=source, **kw).resolved().validate()).split(None)
    return {pairs.paths[i]: pairs.load(i)[1] for i in range(len(pairs))}


def stem(path: str) -> int:
    return int(Path(path).stem.lstrip("p"))


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_palette_16_bit_and_grey_rgb_masks_read_their_class_indices(cwd):
    """A palette PNG's indices are the classes (not its colours); a 16-bit mask reads as stored; an RGB mask whose
    three channels are equal (a greyscale mask saved as RGB) reads as one channel (it was refused); upper-case
    extensions and a .jpg image with a .png mask pair by stem. The same labels after `ropim data convert`."""
    write_pairs(cwd / "voc", mask=palette)
    write_pairs(cwd / "deep", mask=lambda m: Image.fromarray(m.astype(np.uint16)))
    write_pairs(cwd / "grey", mask=lambda m: Image.fromarray(np.stack([m] * 3, -1)), image_ext="JPG", mask_ext="PNG")
    for name in ("voc", "deep", "grey"):
        got = read_all(name)
        assert len(got) == 8 and all(np.array_equal(m, labels(stem(p))) for p, m in got.items()), name
        shown = run_cli_here("data", "inspect", name, "--task", "segment", cwd=cwd)
        assert shown.returncode == 0 and "format pairs" in shown.stdout and "4 classes (bg, road" in shown.stdout
    done = run_cli_here("data", "convert", "grey", "grey-shards", "--task", "segment", cwd=cwd)
    assert done.returncode == 0, done.stderr
    assert all(np.array_equal(m, labels(stem(p))) for p, m in read_all("grey-shards").items())


def test_a_colour_coded_mask_is_refused_naming_it_and_the_fix(cwd):
    """An RGB colour mask was refused as '(12, 16, 3) is not a single-channel label map', naming the image."""
    write_pairs(cwd / "colours", mask=rgb)
    shown = run_cli_here("data", "inspect", "colours", "--task", "segment", cwd=cwd)
    assert shown.returncode == 1 and len(shown.stderr.strip().splitlines()) == 1
    assert "masks/p1.png: an RGB colour mask (3 colours: (0, 0, 0), (0, 128, 0), (224, 224, 192))" in shown.stderr
    assert "convert it to class indices" in shown.stderr
    write_pairs(cwd / "alpha", mask=lambda m: with_alpha(m, np.where(m == 255, 0, 255)))
    with pytest.raises(ConfigError, match="masks/p.\\.png: a LA mask with transparency"):
        read_all("alpha")
    opaque = write_pairs(cwd / "opaque", mask=lambda m: with_alpha(m, np.full_like(m, 255)))
    assert all(np.array_equal(m, labels(stem(p))) for p, m in read_all(opaque.name).items())


def test_a_jpeg_mask_is_refused_naming_it(cwd):
    """masks/*.jpg were not listed ('has no mask', naming the image); JPEG bytes in a .png were read smeared: in an
    ADE20K folder (150 classes) the smeared labels stayed in range, a silently wrong label map."""
    write_pairs(cwd / "jpg", mask_ext="jpg")
    shown = run_cli_here("data", "inspect", "jpg", "--task", "segment", cwd=cwd)
    assert shown.returncode == 1 and "masks/p1.jpg: a JPEG mask (lossy" in shown.stderr
    assert "save label maps as PNG" in shown.stderr
    ade = cwd / "ade"
    for split in ("training", "validation"):
        (ade / "images" / split).mkdir(parents=True)
        (ade / "annotations" / split).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (16, 12), (9, 9, 9)).save(ade / "images" / split / f"a{i}.jpg")
            m = np.where(np.add.outer(np.arange(12), np.arange(16)) > 10, 90, 40).astype(np.uint8)  # a diagonal
            Image.fromarray(m).save(ade / "annotations" / split / f"a{i}.png", format="JPEG", quality=75)
    assert set(np.unique(np.asarray(Image.open(ade / "annotations" / "training" / "a0.png")))) - {40, 90}
    shown = run_cli_here("data", "convert", "ade", "ade-shards", "--task", "segment", cwd=cwd)
    assert shown.returncode == 1 and "annotations/training/a0.png: a JPEG mask" in shown.stderr
    assert not (cwd / "ade-shards").exists()


def test_mask_errors_name_the_mask_file(cwd):
    """A label out of range, a size mismatch and a mask cut short named the image (the fault is in the mask)."""
    root = write_pairs(cwd / "wrong")
    Image.fromarray(np.full((12, 16), 7, np.uint8)).save(root / "masks" / "p2.png")
    with pytest.raises(ConfigError, match="^masks/p2.png: mask holds label 7, outside the 4 classes"):
        read_all("wrong")
    Image.fromarray(np.zeros((6, 8), np.uint8)).save(root / "masks" / "p2.png")
    with pytest.raises(ConfigError, match=r"^masks/p2.png: mask is 8x6 but the image is 16x12 \(images/p2.png\)"):
        read_all("wrong")
    Image.fromarray(labels(2)).save(root / "masks" / "p2.png")
    data = (root / "masks" / "p5.png").read_bytes()
    (root / "masks" / "p5.png").write_bytes(data[:len(data) // 2])
    shown = run_cli_here("data", "inspect", "wrong", "--task", "segment", "--on-bad-image", "fail", cwd=cwd)
    assert shown.returncode == 1 and "(mask masks/p5.png: image file is truncated)" in shown.stderr


def test_a_bad_pair_follows_the_policy_in_pre_flight(cwd):
    """A mask cut short among the sampled pairs stopped even an on_bad_image=skip job before it began (the job
    itself skips such a pair): now skip counts it, fail stops naming it, and a split none of whose sampled pairs
    decodes stops either way."""
    root = write_pairs(cwd / "cut")
    for i in (5, 6):
        data = (root / "masks" / f"p{i}.png").read_bytes()
        (root / "masks" / f"p{i}.png").write_bytes(data[:len(data) // 2])
    shown = run_cli_here("data", "inspect", "cut", "--task", "segment", cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    assert "undecodable 2 of 8 sampled pairs (first: images/p5.png: mask masks/p5.png: image file is truncated)" \
        in shown.stdout
    assert SegDataConfig("cut").resolved().validate().on_bad_image == "skip"  # pre-flight passes; the job skips them
    with pytest.raises(ConfigError, match=r"^images/p5.png: cannot read the pair .*give --data.on_bad_image skip"):
        SegDataConfig("cut", on_bad_image="fail").validate()
    for i in range(8):
        (root / "masks" / f"p{i}.png").write_bytes(b"\x89PNG cut")
    with pytest.raises(ConfigError, match="none of the 7 pairs sampled from the train split decodes"):
        SegDataConfig("cut").validate()


def test_layout_mistakes_get_one_line_each(cwd):
    """Two images of one stem (one was dropped silently), split folders under images/ only (a bare 'No such file or
    directory'), an empty masks/ folder ('p0.png has no mask': true of every image), too many classes for a mask."""
    root = write_pairs(cwd / "twice")
    Image.new("RGB", (16, 12)).save(root / "images" / "p3.jpg")
    with pytest.raises(ConfigError, match="images/p3.jpg and .*images/p3.png have the same name stem 'p3'"):
        read_all("twice")
    root = write_pairs(cwd / "half", n=0)
    for split in ("train", "val"):
        (root / "images" / split).mkdir()
        Image.new("RGB", (16, 12)).save(root / "images" / split / "a.png")
        Image.fromarray(labels(0)).save(root / "masks" / f"{split}-a.png")
    with pytest.raises(ConfigError, match="half/images has split folders \\(train/ \\+ val/\\) but .*half/masks has"):
        read_all("half")
    root = write_pairs(cwd / "nomasks")
    for f in (root / "masks").iterdir():
        f.unlink()
    with pytest.raises(ConfigError, match="no masks in .*nomasks/masks for the 8 images"):
        read_all("nomasks")
    (write_pairs(cwd / "many") / "classes.json").write_text(json.dumps([f"c{i}" for i in range(300)]))
    with pytest.raises(ConfigError, match="names 300 classes; at most 255 fit a mask"):
        read_all("many")


def test_links_follow_the_imagefolder_rules(cwd):
    """Links out of the folder were followed silently (ImageFolder's rule: not without data.follow_links, named);
    a link inside it to another image listed that image twice (possibly in train and val)."""
    write_pairs(cwd / "store")
    (cwd / "linked").mkdir()
    (cwd / "linked" / "images").symlink_to("../store/images")
    (cwd / "linked" / "masks").symlink_to(cwd / "store" / "masks")
    (cwd / "linked" / "classes.json").write_text(json.dumps(CLASSES))
    shown = run_cli_here("data", "inspect", "linked", "--task", "segment", cwd=cwd)
    assert shown.returncode == 1 and "lead outside the source (e.g. images -> " in shown.stderr
    assert "--follow-links true" in shown.stderr
    assert len(read_all("linked", follow_links=True)) == 8
    root = write_pairs(cwd / "some", n=4)
    for sub in ("images", "masks"):
        os.symlink(cwd / "store" / sub / "p5.png", root / sub / "q5.png")
        os.symlink("p0.png", root / sub / "p9.png")  # inside: the same pair again
    shown = run_cli_here("data", "inspect", "some", "--task", "segment", "--val-fraction", "0.5", cwd=cwd)
    assert shown.returncode == 0 and "note        2 symbolic links lead outside the source" in shown.stdout
    assert sorted(read_all("some", val_fraction=0.5)) == ["images/p0.png", "images/p1.png", "images/p2.png",
                                                         "images/p3.png"]
    assert len(read_all("some", val_fraction=0.5, follow_links=True)) == 5


def test_mask_decoding_reads_bytes_as_the_shards_hold_them():
    """The Parquet shards' masks go through the same reader: a JPEG or colour mask there is refused too."""
    from ropim.data.decode import decode_mask

    buf = io.BytesIO()
    palette(labels(1)).save(buf, format="PNG")
    assert np.array_equal(decode_mask(buf.getvalue(), "m"), labels(1))
    buf = io.BytesIO()
    rgb(labels(1)).save(buf, format="PNG")
    with pytest.raises(ConfigError, match="^mask of x.png: an RGB colour mask"):
        decode_mask(buf.getvalue(), "mask of x.png")
    with pytest.raises(ValueError, match="^mask m: cannot identify image file"):
        decode_mask(b"not a png", "m")


def test_pair_files_of_types_not_read_are_named(cwd):
    """TIFF pairs (remote sensing, microscopy) beside PNG ones: left out, and named with the fix as an image folder's
    are (before: left out without a word); a folder pair of TIFFs alone is refused naming them, not as no images."""
    root = write_pairs(cwd / "mixed", n=6)
    Image.new("RGB", (16, 12)).save(root / "images" / "t0.tif")
    Image.fromarray(labels(0)).save(root / "masks" / "t0.tif")
    Image.new("RGB", (16, 12)).save(root / "images" / "t1.TIFF")
    Image.fromarray(labels(1)).save(root / "masks" / "t1.TIFF")
    proc = run_cli_here("data", "inspect", "mixed", "--task", "segment", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 image files of types not read are left out (1 .tif, 1 .tiff)" in proc.stdout, proc.stdout
    assert len(read_all("mixed")) == 6
    only = write_pairs(cwd / "only", n=2, image_ext="tif", mask_ext="tif")
    assert not list((only / "images").glob("*.png"))
    with pytest.raises(ConfigError, match=r"no images in .*only/images; 2 image files of types not read are left "
                                          r"out \(2 \.tif\)"):
        read_all("only")
