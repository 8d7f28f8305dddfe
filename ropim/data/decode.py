"""Decoding images under the bad-image policy, and label maps (``decode_mask``). No torch, no Ray, no MLflow."""

from __future__ import annotations

import ctypes
import io
import logging
import multiprocessing
import re
from multiprocessing.sharedctypes import Synchronized

import numpy as np
from PIL import Image

from ropim.errors import ConfigError, DataError

log = logging.getLogger("ropim.data")
MAX_LOGGED_BAD = 20
FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF")  # the only decoders PIL may use on a file from a data set
DEFAULT_MAX_PIXELS = 25_000_000  # DataConfig.max_pixels' default: 2× a 12 MP photo, the largest an ImageNet image is


class BadImageError(DataError):
    """An image that cannot be decoded, under ``on_bad_image="fail"``; the message names it."""


class BadImages:
    """The bad-image policy of a dataset: ``skip`` counts and logs (first 20 paths per process), ``fail`` raises. An
    image given by its ``index`` counts once. After ``share``, the processes a DataLoader starts (each epoch) see the
    images known bad and add to the count this process reads."""

    def __init__(self, policy: str = "skip", max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
        self.policy, self.max_pixels, self.paths = policy, max_pixels, []
        self.known: set[int] = set()  # indices of images found bad
        self.local = 0
        self.counter: Synchronized | None = None  # shared memory, after ``share``: the count, and a flag per image
        self.flags: ctypes.Array | None = None

    @property
    def count(self) -> int:
        """Images skipped so far, by this process and (after ``share``) the processes started after it."""
        return self.counter.value if self.counter is not None else self.local

    def share(self, size: int) -> None:
        """Count and flag the ``size`` images in shared memory from now on: call it before a DataLoader starts its
        worker processes."""
        if self.counter is None:
            self.counter = multiprocessing.Value("q", self.local)
            self.flags = multiprocessing.Array("b", [i in self.known for i in range(size)], lock=False)

    def seen(self, index: int) -> bool:
        """Whether image ``index`` is known bad (in any process, after ``share``)."""
        return index in self.known or (self.flags is not None and bool(self.flags[index]))

    def add(self, path: str, err: BaseException | str, index: int | None = None) -> None:
        if self.policy == "fail":
            raise BadImageError(f"{path}: cannot decode image ({reason(err)}); remove or replace the file, "
                                f"or set data.on_bad_image=skip to skip such files")
        if index is not None:
            self.known.add(index)
        if self.counter is None:
            self.local += 1
        else:
            with self.counter.get_lock():
                if index is not None and self.flags[index]:
                    return  # another process counted it
                if index is not None:
                    self.flags[index] = 1
                self.counter.value += 1
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


def decode_mask(data: bytes, name: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """The (H, W) class indices of an encoded label map (``name``: its file, for messages): a greyscale, 16-bit or
    palette image as stored (a palette PNG's indices are the classes, as Pascal VOC's), an RGB(A) one whose channels
    are all equal as one channel. DataError naming ``name`` and the fix for a JPEG (lossy: labels smeared along
    every edge), colours or transparency; ValueError naming it for an undecodable or oversized file."""
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            if img.format == "JPEG":
                raise DataError(f"{name}: a JPEG mask (lossy compression changes the labels along every edge); "
                                "save label maps as PNG (greyscale 'L' or palette 'P', one class index per pixel)")
            if img.width * img.height > max_pixels:
                raise ValueError(f"{img.width}x{img.height} pixels, over data.max_pixels={max_pixels:,}")
            img.load()
            mode, labels = img.mode, np.asarray(img)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 — any decoder failure makes the pair bad; say which file
        raise ValueError(f"mask {name}: {reason(err)}") from None
    return label_map(labels, name, mode)


def label_map(labels: np.ndarray, name: str, mode: str = "RGB") -> np.ndarray:
    """(H, W) labels from a decoded mask: one channel as it is; several (``mode``) only when the colour channels are
    equal and any alpha is opaque; DataError naming ``name`` and the fix otherwise."""
    if labels.ndim == 2:
        return labels.astype(np.uint8) if labels.dtype == bool else labels
    fix = ("a mask holds one class index per pixel (0..K-1, 255 = ignore): convert it to class indices and save it "
           "as a greyscale ('L') or palette ('P') PNG")
    alpha = mode in ("LA", "PA", "RGBA") or labels.shape[2] in (2, 4)
    colour, opaque = (labels[..., :-1], labels[..., -1]) if alpha else (labels, None)
    if opaque is not None and (opaque != opaque.max(initial=0)).any():
        raise DataError(f"{name}: a {mode} mask with transparency; {fix}")
    if (colour == colour[..., :1]).all():
        return colour[..., 0]
    found = np.unique(colour.reshape(-1, colour.shape[-1]), axis=0)  # an error's cost only
    shown = ", ".join(str(tuple(int(v) for v in c)) for c in found[:3]) + (", …" if len(found) > 3 else "")
    raise DataError(f"{name}: an {mode} colour mask ({len(found)} colours: {shown}); colour-coded classes are not "
                    f"read as classes: {fix}")


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
