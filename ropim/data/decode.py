"""Decoding images under the bad-image policy. No torch, no Ray, no MLflow."""

from __future__ import annotations

import io
import logging
import re

import numpy as np
from PIL import Image

from ropim.errors import ConfigError

log = logging.getLogger("ropim.data")
MAX_LOGGED_BAD = 20
FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")  # the only decoders PIL may use on a file from a data set
DEFAULT_MAX_PIXELS = 25_000_000  # DataConfig.max_pixels' default: 2× a 12 MP photo, the largest an ImageNet image is


class BadImageError(ConfigError):
    """An image that cannot be decoded, under ``on_bad_image="fail"``; the message names it."""


class BadImages:
    """The bad-image policy in one process: ``skip`` counts and logs (first 20 paths), ``fail`` raises."""

    def __init__(self, policy: str = "skip", max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.policy, self.max_pixels, self.count, self.paths = policy, max_pixels, 0, []

    def add(self, path: str, err: BaseException | str) -> None:
        if self.policy == "fail":
            raise BadImageError(f"{path}: cannot decode image ({reason(err)}); remove or replace the file, "
                                f"or set data.on_bad_image=skip to skip such files")
        self.count += 1
        if len(self.paths) < MAX_LOGGED_BAD:
            self.paths.append(path)
            more = "; further bad images are counted, not logged" if len(self.paths) == MAX_LOGGED_BAD else ""
            log.warning(f"skipping undecodable image {path} ({reason(err)}){more}")


def decode_rgb(data: bytes | np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """An RGB image from encoded bytes (greyscale, 16-bit greyscale, RGBA, palette converted) or an (H, W, 3) uint8
    array.

    Only the ``FORMATS`` decoders are tried, and an image of more than ``max_pixels`` pixels is refused from its
    header, before decoding (a small file can declare a huge image). Raises on undecodable, truncated or oversized
    data; callers apply the bad-image policy.
    """
    if isinstance(data, np.ndarray):
        return Image.fromarray(data)
    with Image.open(io.BytesIO(data), formats=FORMATS) as img:
        if img.width * img.height > max_pixels:
            raise ValueError(f"{img.width}x{img.height} = {img.width * img.height:,} pixels, over "
                             f"data.max_pixels={max_pixels:,}")
        img.load()  # decodes everything: truncated files raise here
        if img.mode.startswith("I"):  # a 16-bit greyscale PNG ("I;16", "I"): its top 8 bits (convert clips at 255)
            return Image.fromarray((np.clip(np.asarray(img), 0, 65535) >> 8).astype(np.uint8)).convert("RGB")
        if img.mode == "P" and "transparency" in img.info:
            return img.convert("RGBA").convert("RGB")
        return img.convert("RGB")


def try_decode(data: bytes | np.ndarray | None, path: str, bad: BadImages) -> Image.Image | None:
    """``decode_rgb`` under the policy: None (counted, logged) for a bad image when skipping."""
    try:
        if data is None:
            raise OSError("unreadable file")
        return decode_rgb(data, bad.max_pixels)
    except Exception as err:  # noqa: BLE001 — any decoder failure makes the image bad
        bad.add(path, err)
        return None


def undecodable(sample: list[tuple[str, bytes | np.ndarray | None]],
                max_pixels: int = DEFAULT_MAX_PIXELS) -> list[tuple[str, str]]:
    """(path, why) of each image of ``sample`` ((path, data or None for an unreadable file) pairs) that
    ``decode_rgb`` refuses."""
    bad = []
    for path, data in sample:
        try:
            if data is None:
                raise OSError("unreadable file")
            decode_rgb(data, max_pixels)
        except Exception as err:  # noqa: BLE001 — any decoder failure makes the image bad
            bad.append((path, reason(err)))
    return bad


def reason(err: BaseException | str) -> str:
    """Why an image is bad, in one line, without PIL's ``<_io.BytesIO object at 0x…>``."""
    why = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", (str(err).splitlines() or [""])[0])
    return why or (type(err).__name__ if isinstance(err, BaseException) else "undecodable")


def none_decode(source: str, what: str, bad: list[tuple[str, str]]) -> ConfigError:
    """The one error for a source none of whose sampled images (``what``: which ones) decodes."""
    path, why = bad[0]
    return ConfigError(f"data source {source!r}: none of {what} decodes ({path}: {why}); a data set's images must be "
                       "JPEG, PNG, WebP, BMP or GIF files (in Parquet: their encoded bytes in the 'image' column): "
                       "replace them, or write the shards again from the original images (`ropim data convert`)")
