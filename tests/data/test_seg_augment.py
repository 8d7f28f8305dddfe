"""mmseg's photometric distortion and cat_max_ratio crop (``ropim.data.seg_augment``) on fixed inputs: pixels worked
out by hand, OpenCV's own HSV conversions (a fixture written by ``scripts/opencv_hsv.py``), scripted and seeded crop
draws, and the training transform's padding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from ropim.data.augment import IMAGENET_MEAN
from ropim.data.pair_lists import ArraySegList
from ropim.data.seg_augment import (
    CatMaxRandomCrop,
    Photometric,
    affine,
    crop_box,
    crop_ok,
    hsv_to_rgb,
    rgb_to_hsv,
)
from ropim.data.seg_datasets import SegDataset, seg_train_transform

FIXTURE = Path(__file__).parent / "fixtures" / "opencv_hsv.npz"


def px(*values: int) -> np.ndarray:
    return np.array(values, np.uint8)


def test_hsv_conversions_match_opencv():
    # (200, 100, 50): V = 200, S = 150/200 · 255 = 191.25 -> 191, H = 60° · 50/150 = 20° -> 10 on OpenCV's 0..179
    assert rgb_to_hsv(px(200, 100, 50)).tolist() == [10, 191, 200]
    # back in sector 0 (H < 30): R = V, G = V(1 - S(1 - f)), B = V(1 - S), f = H/30, each · 255 and truncated:
    # (28, 191, 200) -> G 190.013, B 50.196; (20, 100, 200) -> G 173.856, B 121.569 (rounding would give 174, 122)
    assert hsv_to_rgb(px(28, 191, 200)).tolist() == [200, 190, 50]
    assert hsv_to_rgb(px(20, 100, 200)).tolist() == [200, 173, 121]
    assert hsv_to_rgb(px(5, 200, 150)).tolist() == [150, 51, 32]  # G 51.961, B 32.353
    grey = np.arange(256, dtype=np.uint8)
    assert (hsv_to_rgb(np.stack([grey * 0, grey * 0, grey], -1)) == grey[:, None]).all()  # S = 0: R = G = B = V
    cv = np.load(FIXTURE)
    assert np.array_equal(rgb_to_hsv(cv["rgb"]), cv["rgb_to_hsv"]), f"OpenCV {cv['opencv']} differs"
    assert np.array_equal(hsv_to_rgb(cv["hsv"]), cv["hsv_to_rgb"]), f"OpenCV {cv['opencv']} differs"


def test_each_step_by_hand():
    img = px(100, 250, 30)[None]
    assert Photometric(brightness=10.7).apply(img).tolist() == [[110, 255, 40]]  # additive, clipped, truncated
    assert Photometric(brightness=-40.0).apply(img).tolist() == [[60, 210, 0]]
    assert Photometric(contrast=1.5).apply(img).tolist() == [[150, 255, 45]]  # 100 · 1.5, 250 · 1.5 clipped
    assert Photometric(contrast=0.55).apply(px(101, 0, 255)[None]).tolist() == [[55, 0, 140]]  # 55.55, 140.25
    # hue +18 on (200, 100, 50): H 10 -> 28 (56°), then back: (200, 190, 50) as above
    assert Photometric(hue=18).apply(px(200, 100, 50)[None]).tolist() == [[200, 190, 50]]
    # hue -12: H 10 -> 178 (-4°), sector 5: R = V, G = V(1 - S) 50.196, B = V(1 - S·f) 60.18 with f = 178/30 - 5
    assert Photometric(hue=-12).apply(px(200, 100, 50)[None]).tolist() == [[200, 50, 60]]
    # saturation 0.5: S 191 -> 95, then (10, 95, 200) -> G 150.327, B 125.490
    assert Photometric(saturation=0.5).apply(px(200, 100, 50)[None]).tolist() == [[200, 150, 125]]


def test_contrast_goes_first_or_last():
    img = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    first = Photometric(brightness=5.0, contrast=1.4, saturation=0.7, hue=3, contrast_first=True).apply(img)
    last = Photometric(brightness=5.0, contrast=1.4, saturation=0.7, hue=3, contrast_first=False).apply(img)
    sat_hue = [Photometric(saturation=0.7).apply, Photometric(hue=3).apply]
    by_hand_first = affine(affine(img, beta=5.0), alpha=1.4)
    by_hand_last = affine(img, beta=5.0)
    for step in sat_hue:
        by_hand_first, by_hand_last = step(by_hand_first), step(by_hand_last)
    assert np.array_equal(first, by_hand_first)
    assert np.array_equal(last, affine(by_hand_last, alpha=1.4))
    assert not np.array_equal(first, last)


def test_draws_each_step_with_probability_half_within_mmseg_ranges():
    torch.manual_seed(0)
    draws = [Photometric.sample() for _ in range(4000)]
    for name in ("brightness", "contrast", "saturation", "hue"):
        values = [getattr(d, name) for d in draws if getattr(d, name) is not None]
        assert 0.46 < len(values) / len(draws) < 0.54, name
    assert 0.46 < np.mean([d.contrast_first for d in draws]) < 0.54
    brightness = [d.brightness for d in draws if d.brightness is not None]
    assert -32 <= min(brightness) < -31 and 31 < max(brightness) <= 32
    assert all(0.5 <= d.contrast < 1.5 for d in draws if d.contrast is not None)
    assert all(0.5 <= d.saturation < 1.5 for d in draws if d.saturation is not None)
    assert {d.hue for d in draws if d.hue is not None} == set(range(-18, 18))  # numpy's randint(-18, 18)


def scripted(offsets: list[int]):
    """A ``randint`` that returns ``offsets`` in turn and records the bound of each call."""
    calls = []

    def randint(n: int) -> int:
        calls.append(n)
        return offsets[len(calls) - 1]

    return randint, calls


def test_crop_ratio_rule():
    labels = torch.tensor([[0, 0, 0, 1]] * 4)
    assert not crop_ok(labels, 0.75)  # 12 of 16 = 0.75: not below
    assert crop_ok(labels, 0.76)
    assert not crop_ok(torch.zeros(4, 4, dtype=torch.uint8), 0.75)  # one class
    labels = torch.tensor([[255, 0, 0, 0]] * 3 + [[255, 255, 255, 1]])
    assert not crop_ok(labels, 0.75)  # ignore left out: 9 of 10 (counting it, 9 of 16 would pass)
    assert not crop_ok(torch.tensor([[255, 255, 0, 0]]), 0.75)  # one class beside the ignore label


def test_crop_is_redrawn_while_one_class_dominates():
    # a 4 x 12 label map: columns 0-5 class 0, 6-7 class 1, 8-11 class 0; crops of 4 x 4
    mask = torch.zeros(4, 12, dtype=torch.uint8)
    mask[:, 6:8] = 1
    randint, calls = scripted([0, 0, 0, 3, 0, 5])  # (top, left) per box: left 0 (one class), 3 (0.75), 5 (0.5)
    assert crop_box(mask, 4, randint) == (0, 5, 4, 4)
    assert calls == [1, 9] * 3  # offsets 0..0 in height, 0..8 in width
    randint, calls = scripted([0, 0])
    assert crop_box(mask, 4, randint, cat_max_ratio=1.0) == (0, 0, 4, 4) and len(calls) == 2  # no retry
    randint, calls = scripted(list(range(22)))
    assert crop_box(torch.zeros(30, 30), 8, randint) == (20, 21, 8, 8)  # 10 redraws fail: the 11th box stays
    assert len(calls) == 22
    randint, _ = scripted([0, 0])
    assert crop_box(mask, 16, randint, cat_max_ratio=1.0) == (0, 0, 4, 12)  # a short side is kept whole


def test_seeded_crop_takes_the_retry():
    mask = torch.zeros(4, 12, dtype=torch.uint8)
    mask[:, 6:8] = 1
    image = torch.arange(3 * 4 * 12, dtype=torch.uint8).reshape(3, 4, 12)
    torch.manual_seed(0)  # the crop's draws, one (top, left) per box: lefts 0 (one class: refused), then 6
    boxes = [(int(torch.randint(1, ())), int(torch.randint(9, ()))) for _ in range(11)]
    first = next(i for i, (_, left) in enumerate(boxes) if 3 < left < 7)  # the first box with 2 classes below 0.75
    assert first == 1 and not crop_ok(mask[:, boxes[0][1]:boxes[0][1] + 4], 0.75)
    torch.manual_seed(0)
    x, y = CatMaxRandomCrop(4)(tv_tensors.Image(image), tv_tensors.Mask(mask))
    left = boxes[first][1]
    assert torch.equal(x, image[:, :, left:left + 4]) and torch.equal(y, mask[:, left:left + 4])
    assert isinstance(x, tv_tensors.Image) and isinstance(y, tv_tensors.Mask)


def test_train_transform_pads_bottom_right_with_the_mean_colour_and_ignore():
    mask = np.zeros((32, 32), np.uint8)
    mask[:, :8] = 1
    image = np.full((32, 32, 3), 77, np.uint8)
    pairs = ArraySegList(image[None], mask[None], ["a"], 2)
    torch.manual_seed(0)
    x, y = SegDataset(pairs, ["bg", "stripe"], seg_train_transform(64, (0.5, 0.5), hflip=0.0,
                                                                   photometric=False))[0]
    assert x.shape == (3, 64, 64) and (y[:32, :32] != 255).all()
    assert (y[32:] == 255).all() and (y[:, 32:] == 255).all()  # the image stays at the top left
    assert (x[:, 32:] == 0).all() and (x[:, :, 32:] == 0).all()  # 0 after normalisation: the mean colour
    assert x[0, 0, 0] == pytest.approx((77 / 255 - IMAGENET_MEAN[0]) / 0.229, abs=1e-5)
