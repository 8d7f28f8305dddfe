"""Pre-flight's decode check of an ImageFolder (``check_decodes``): it decodes the first images of the training split
as the job lists them, and walks the tree only up to them, not the whole of a large tree."""

from __future__ import annotations

import os

import pytest
from PIL import Image
from sample_data import pixels

from ropim.data.config import DataConfig
from ropim.data.formats.imagefolder import train_head
from ropim.data.sources import PREFLIGHT_SAMPLE, check_decodes, open_source
from ropim.errors import ConfigError

CLASSES = ("a", "b", "c", "d", "e")


def tree(root, bad_first: int = 0, split: bool = False):
    """ROOT/[train/]<class>/<i>.png, 20 images a class (class a's first ``bad_first`` zero-byte files), a sub-folder
    and an inside link (an image listed twice) in class a; with ``split``, ROOT/val/<class>/ too."""
    top = root / "train" if split else root
    for c in CLASSES:
        (top / c / "sub").mkdir(parents=True)
        for i in range(20):
            f = top / c / ("sub" if i % 7 == 3 else "") / f"{i:02d}.png"
            if c == "a" and i < bad_first:
                f.write_bytes(b"")
            else:
                Image.fromarray(pixels(8, 8, i)).save(f)
    os.symlink("05.png", top / "a" / "00-again.png")
    if split:
        for c in CLASSES:
            (root / "val" / c).mkdir(parents=True)
            Image.fromarray(pixels(8, 8, 99)).save(root / "val" / c / "v.png")
    return root


@pytest.fixture
def scanned(monkeypatch):
    """The folders ``os.scandir`` reads from now on."""
    seen, real = [], os.scandir

    def scandir(path="."):
        seen.append(os.path.basename(os.fspath(path)))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    return seen


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_sample_is_the_head_of_the_training_split_as_the_job_lists_it(tmp_path, split, seed):
    """Same order (classes, then files before sub-folders), same link rule (an image listed once), same split."""
    cfg = DataConfig(str(tree(tmp_path, split=split)), val_fraction=0.5, split_seed=seed)
    train = open_source(cfg).split("train")
    for k in (1, PREFLIGHT_SAMPLE, 30, 200):
        head = train_head(cfg, k)
        assert head.paths == train.paths[:k] and head.labels.tolist() == train.labels[:k].tolist()
        assert head.classes == train.classes and head.root == train.root


def test_the_decode_check_stops_walking_at_the_sample(tmp_path, scanned):
    """A large tree was listed whole (1.28M files for ImageNet) to decode 8 images; the later classes are not read."""
    check_decodes(DataConfig(str(tree(tmp_path))))
    assert {"b", "c", "d", "e"}.isdisjoint(scanned) and "a" in scanned


def test_a_tree_whose_first_images_do_not_decode_is_still_refused(tmp_path, scanned):
    cfg = DataConfig(str(tree(tmp_path, bad_first=20)), val_fraction=0.2)
    first = open_source(cfg).split("train").paths[0]
    scanned.clear()
    with pytest.raises(ConfigError, match=f"none of the first {PREFLIGHT_SAMPLE} images of the training split "
                                          f"decodes \\({first}: "):
        check_decodes(cfg)
    assert {"b", "c", "d", "e"}.isdisjoint(scanned)


def test_an_empty_training_split_is_refused_as_the_listing_refuses_it(tmp_path):
    (tmp_path / "a").mkdir()
    Image.fromarray(pixels(8, 8, 0)).save(tmp_path / "a" / "only.png")
    cfg = DataConfig(str(tmp_path), val_fraction=0.99)  # the one image hashes into val
    with pytest.raises(ConfigError, match="split 'train' is empty; add images"):
        check_decodes(cfg)
