"""Segmentation scores against a case computed by hand, and the whole-image / sliding-window inference."""

from __future__ import annotations

import math

import pytest
import torch

from ropim.eval.segmentation import (
    pixel_confusion,
    predict_logits,
    segmentation_scores,
    slide_logits,
    window_starts,
)


def test_iou_and_pixel_accuracy_against_a_hand_computed_case():
    # 4 classes; class 3 is in neither map; 255 pixels are ignored wherever they are
    target = torch.tensor([[0, 0, 1, 1],
                           [0, 2, 2, 255]])
    pred = torch.tensor([[0, 1, 1, 1],
                         [2, 2, 0, 3]])
    conf = pixel_confusion(pred, target, 4)
    # rows = truth: class 0 -> predicted 0, 1, 2; class 1 -> 1, 1; class 2 -> 2, 0
    assert conf.tolist() == [[1, 1, 1, 0], [0, 2, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    s = segmentation_scores(conf)
    # IoU = TP / (TP + FP + FN): class 0: 1 / (1 + 1 + 2) = 1/4; class 1: 2 / (2 + 1 + 0) = 2/3;
    # class 2: 1 / (1 + 1 + 1) = 1/3; class 3: neither labelled nor predicted -> NaN, out of the mean
    assert s["per_class_iou"][:3] == pytest.approx([25.0, 200 / 3, 100 / 3])
    assert math.isnan(s["per_class_iou"][3])
    assert s["miou"] == pytest.approx((25.0 + 200 / 3 + 100 / 3) / 3)
    assert s["pixel_acc"] == pytest.approx(100 * 4 / 7)  # 4 of the 7 labelled pixels


def test_a_class_predicted_but_absent_from_the_labels_counts_as_zero():
    conf = pixel_confusion(torch.tensor([1, 1]), torch.tensor([0, 0]), 3)
    s = segmentation_scores(conf)
    assert s["per_class_iou"][:2] == [0.0, 0.0] and math.isnan(s["per_class_iou"][2])
    assert s["miou"] == 0.0 and s["pixel_acc"] == 0.0


def test_confusions_add_over_images_and_workers():
    a = pixel_confusion(torch.tensor([0, 1]), torch.tensor([0, 0]), 2)
    b = pixel_confusion(torch.tensor([1, 1]), torch.tensor([1, 255]), 2)
    assert (a + b).tolist() == [[1, 1], [0, 1]]


def test_windows_cover_the_image_the_last_flush_with_its_end():
    assert window_starts(512, 512, 341) == [0]
    assert window_starts(683, 512, 341) == [0, 171]
    assert window_starts(1100, 512, 341) == [0, 341, 588]


class Constant(torch.nn.Module):
    """Logits at 1/4 resolution equal to the window's mean colour per class channel, so overlaps average."""

    def forward(self, x):
        b, _, h, w = x.shape
        return x.mean((1, 2, 3), keepdim=True).expand(b, 2, h // 4, w // 4)


def test_sliding_window_averages_overlapping_windows_and_whole_resizes():
    image = torch.zeros(3, 8, 12)
    image[:, :, 8:] = 1.0  # the right third is bright
    logits = slide_logits(Constant(), image, crop=8, stride=4, num_classes=2)  # windows at x = 0 and 4
    assert logits.shape == (2, 8, 12)
    # window x=0..8 is dark (mean 0); window x=4..12 has half bright (mean 0.5); x in 4..8 is covered by both
    assert logits[0, 0, 0].item() == 0.0 and logits[0, 0, 10].item() == 0.5
    assert logits[0, 0, 6].item() == pytest.approx(0.25)
    whole = predict_logits(Constant(), image, crop=8, num_classes=2, mode="whole", out_size=(4, 6))
    assert whole.shape == (2, 4, 6) and whole.mean().item() == pytest.approx(1 / 3, abs=0.02)
    small = predict_logits(Constant(), torch.ones(3, 6, 6), crop=8, num_classes=2, mode="slide")
    assert small.shape == (2, 6, 6)  # padded to one window, cut back
