"""OpenCV's 8-bit RGB <-> HSV conversions against ``ropim.data.seg_augment``'s: every input, and the test fixture.

OpenCV is not a dependency of ropim; run this with any OpenCV importable, e.g.

    pip install --target /tmp/cv2 --no-deps opencv-python-headless
    PYTHONPATH=/tmp/cv2:. .venv/bin/python scripts/opencv_hsv.py            # all 2^24 RGB and 180 x 2^16 HSV inputs
    PYTHONPATH=/tmp/cv2:. .venv/bin/python scripts/opencv_hsv.py --fixture  # rewrite tests/data/fixtures/opencv_hsv.npz

Rows are 256 (every input) or 64 (fixture) pixels wide, so OpenCV runs its vectorised path on every pixel (on CPUs
with AVX2 or AVX-512; see the module doc of ``ropim.data.seg_augment``). Prints the mismatches; exits 1 on any.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2
import numpy as np

from ropim.data.seg_augment import hsv_to_rgb, rgb_to_hsv

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "data" / "fixtures" / "opencv_hsv.npz"


def every_input() -> tuple[np.ndarray, np.ndarray]:
    """All RGB triples as a (65536, 256, 3) image and all HSV triples (H < 180) as a (46080, 256, 3) image."""
    axes = np.meshgrid(np.arange(256), np.arange(256), np.arange(256), indexing="ij")
    rgb = np.stack(axes, -1).astype(np.uint8).reshape(-1, 256, 3)
    axes = np.meshgrid(np.arange(180), np.arange(256), np.arange(256), indexing="ij")
    hsv = np.stack(axes, -1).astype(np.uint8).reshape(-1, 256, 3)
    return rgb, hsv


def fixture_inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random 64 x 64 RGB image and a random 64 x 64 HSV image (H < 180)."""
    rng = np.random.default_rng(seed)
    rgb = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    hsv = np.stack([rng.integers(0, 180, (64, 64)), rng.integers(0, 256, (64, 64)),
                    rng.integers(0, 256, (64, 64))], -1).astype(np.uint8)
    return rgb, hsv


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", action="store_true", help=f"write {FIXTURE.name} instead of checking all inputs")
    args = parser.parse_args()
    rgb, hsv = fixture_inputs() if args.fixture else every_input()
    cv_hsv, cv_rgb = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV), cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    if args.fixture:
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(FIXTURE, rgb=rgb, rgb_to_hsv=cv_hsv, hsv=hsv, hsv_to_rgb=cv_rgb,
                            opencv=np.array(cv2.__version__))
        print(f"wrote {FIXTURE} (OpenCV {cv2.__version__})")
    bad_hsv = int((rgb_to_hsv(rgb) != cv_hsv).any(-1).sum())
    bad_rgb = int((hsv_to_rgb(hsv) != cv_rgb).any(-1).sum())
    print(f"OpenCV {cv2.__version__}: RGB->HSV {bad_hsv} of {rgb[..., 0].size} differ, "
          f"HSV->RGB {bad_rgb} of {hsv[..., 0].size} differ")
    return 1 if bad_hsv or bad_rgb else 0


if __name__ == "__main__":
    sys.exit(main())
