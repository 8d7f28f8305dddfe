"""MoCo v3's two asymmetric views: the probabilities of blur and solarisation per view, sizes, and that the views of one
image differ while a reseeded generator repeats them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms

from ropim.data.views import Blur, TwoViews


def probabilities(view: transforms.Compose) -> dict[str, float]:
    """{step: probability} of a view pipeline's random blur and solarisation."""
    out = {}
    for t in view.transforms:
        if isinstance(t, transforms.RandomApply) and isinstance(t.transforms[0], Blur):
            out["blur"] = t.p
        if isinstance(t, transforms.RandomSolarize):
            out["solarize"] = t.p
    return out


def test_views_are_asymmetric_as_in_moco_v3():
    views = TwoViews(32)
    assert probabilities(views.view1) == {"blur": 1.0, "solarize": 0.0}
    assert probabilities(views.view2) == {"blur": 0.1, "solarize": 0.2}
    blur = next(t.transforms[0] for t in views.view1.transforms if isinstance(t, transforms.RandomApply)
                and isinstance(t.transforms[0], Blur))
    assert blur.sigma == pytest.approx((0.1 * 32 / 224, 2.0 * 32 / 224))  # MoCo v3's σ at 224², scaled


def test_two_views_differ_and_repeat_under_the_same_seed():
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    torch.manual_seed(0)
    a1, a2 = TwoViews(32)(img)
    torch.manual_seed(0)
    b1, b2 = TwoViews(32)(img)
    assert a1.shape == a2.shape == (3, 32, 32) and a1.dtype == torch.float32
    assert not torch.equal(a1, a2)
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
