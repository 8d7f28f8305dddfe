"""MoCo v3's two asymmetric views of an image (BYOL's recipe, as MoCo v3 and LGP use it), with torchvision:

    both:  RandomResizedCrop(size, scale=(crop_min, 1)) → ColorJitter(0.4, 0.4, 0.2, 0.1) with p 0.8 →
           grayscale with p 0.2 → Gaussian blur → [solarize] → horizontal flip → tensor, ImageNet-normalised
    view 1: blur always, no solarisation; view 2: blur with p 0.1, solarisation with p 0.2

The blur's σ is drawn from [0.1, 2.0] px at 224² (MoCo v3's PIL radius) and scaled with the image size, so a 32²
digit is blurred as much, relative to its size, as a 224² photograph. Randomness comes from torch's generator
(reseeded per epoch and worker by the training loop).
"""

from __future__ import annotations

import torch
from PIL import Image, ImageFilter
from torchvision import transforms

from ropim.data.augment import IMAGENET_MEAN, IMAGENET_STD

BLUR_SIGMA = (0.1, 2.0)  # px at 224²
REFERENCE_SIZE = 224


class Blur:
    """Gaussian blur of a PIL image with σ uniform in ``sigma`` (pixels), drawn from torch's generator."""

    def __init__(self, sigma: tuple[float, float]) -> None:
        self.sigma = sigma

    def __call__(self, img: Image.Image) -> Image.Image:
        lo, hi = self.sigma
        radius = lo + (hi - lo) * torch.rand(()).item()
        return img.filter(ImageFilter.GaussianBlur(radius=radius))


def moco_view(img_size: int, crop_min: float, blur: float, solarize: float) -> transforms.Compose:
    """One of MoCo v3's view pipelines at ``img_size``: blur with probability ``blur``, solarisation with
    probability ``solarize``."""
    scale = img_size / REFERENCE_SIZE
    return transforms.Compose([
        transforms.RandomResizedCrop(img_size, scale=(crop_min, 1.0)),
        transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([Blur((BLUR_SIGMA[0] * scale, BLUR_SIGMA[1] * scale))], p=blur),
        transforms.RandomSolarize(threshold=128, p=solarize),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


class TwoViews:
    """PIL image → (view 1, view 2), each float32 (3, size, size): MoCo v3's asymmetric pair."""

    def __init__(self, img_size: int, crop_min: float = 0.08) -> None:
        self.view1 = moco_view(img_size, crop_min, blur=1.0, solarize=0.0)
        self.view2 = moco_view(img_size, crop_min, blur=0.1, solarize=0.2)

    def __call__(self, img: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        img = img.convert("RGB")
        return self.view1(img), self.view2(img)
