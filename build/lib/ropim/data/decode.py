"""Decoding images under the bad-image policy. No torch, no Ray, no MLflow."""

from __future__ import annotations

import io
import logging

import numpy as np
from PIL import Image

from ropim.errors import ConfigError

log = logging.getLogger("ropim.data")
MAX_LOGGED_BAD = 20


class BadImageError(ConfigError):
    """An image that cannot be decoded, under ``on_bad_image="fail"``; the message names it."""


class BadImages:
    """The bad-image policy in one process: ``skip`` counts and logs (first 20 paths), ``fail`` raises."""

    def __init__(self, policy: str = "skip") -> None:
        self.policy, self.count, self.paths = policy, 0, []

    def add(self, path: str, err: BaseException | str) -> None:
        if self.policy == "fail":
            raise BadImageError(f"{path}: cannot decode image ({err}); remove or replace the file, "
                                f"or set data.on_bad_image=skip to skip such files")
        self.count += 1
        if len(self.paths) < MAX_LOGGED_BAD:
            self.paths.append(path)
            more = "; further bad images are counted, not logged" if len(self.paths) == MAX_LOGGED_BAD else ""
            log.warning(f"skipping undecodable image {path} ({err}){more}")


def decode_rgb(data: bytes | np.ndarray) -> Image.Image:
    """An RGB image from encoded bytes (greyscale/RGBA/palette converted) or an (H, W, 3) uint8 array.

    Raises on undecodable or truncated data (PIL's errors); callers apply the bad-image policy.
    """
    if isinstance(data, np.ndarray):
        return Image.fromarray(data)
    with Image.open(io.BytesIO(data)) as img:
        img.load()  # decodes everything: truncated files raise here
        if img.mode == "P" and "transparency" in img.info:
            return img.convert("RGBA").convert("RGB")
        return img.convert("RGB")


def try_decode(data: bytes | np.ndarray | None, path: str, bad: BadImages) -> Image.Image | None:
    """``decode_rgb`` under the policy: None (counted, logged) for a bad image when skipping."""
    try:
        if data is None:
            raise OSError("unreadable file")
        return decode_rgb(data)
    except Exception as err:  # noqa: BLE001 — any decoder failure makes the image bad
        bad.add(path, err)
        return None

