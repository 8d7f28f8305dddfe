"""Which format a source has, and opening it: the one door from a ``DataConfig`` (classification) or
``SegDataConfig`` (segmentation) to its splits, and the pre-flight checks of a source. The formats are modules of
``ropim.data.formats``, each with ``NAME``, ``TASKS``, ``detect(path)``, ``check(cfg)`` and ``source(cfg, img_size)``;
``auto`` tries them in ``FORMATS`` order. No torch, no Ray, no MLflow.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

from ropim.data import footers
from ropim.data.decode import none_decode, undecodable
from ropim.data.formats import ade20k, cifar, digits, imagefolder, pairs, parquet
from ropim.data.formats.common import CLASSIFY, SEGMENT, Source, split_indices
from ropim.data.lists import ImageList
from ropim.errors import ConfigError
from ropim.paths import is_uri, resolve_path

if TYPE_CHECKING:  # the config imports this module to check a source
    from ropim.data.config import DataConfig

log = logging.getLogger("ropim.data")

FORMATS = (digits, parquet, cifar, ade20k, imagefolder, pairs)  # auto detection tries them in this order
HINT = {CLASSIFY: "give 'digits', an ImageFolder tree (ROOT/<class>/<image>), a CIFAR python folder "
                  "(cifar-10-batches-py/), or Parquet shards (a folder, glob or s3:// URI)",
        SEGMENT: "give 'digits', an ADE20K folder (images/ + annotations/), an images/ + masks/ folder pair, or "
                 "Parquet shards"}
PREFLIGHT_SAMPLE = 8  # the first images of a training split that pre-flight decodes
LISTED: dict[tuple, Source] | None = None  # inside ``one_listing``: (resolved config, img_size) -> its Source
LISTING = threading.RLock()  # a background evaluation opens sources beside the training thread


def formats(task: str) -> dict[str, ModuleType]:
    """{name: format module} of the formats that hold ``task``'s items, in detection order."""
    return {f.NAME: f for f in FORMATS if task in f.TASKS}


def detect_format(cfg: DataConfig) -> ModuleType:
    """The format of ``cfg.source`` (``cfg.format`` when forced, else detected); ConfigError naming the path
    otherwise. Cheap: no file is read."""
    known, forced, location = formats(cfg.TASK), cfg.format, cfg.source
    if location == "digits" and forced in ("auto", "digits"):
        return digits
    if forced == "digits":
        raise ConfigError(f"data source {location!r} with format=digits: use source=digits")
    if is_uri(location) or any(c in location for c in "*?["):
        if forced not in ("auto", "parquet"):
            raise ConfigError(f"data source {location!r}: format={forced} reads local folders only; "
                              f"use format=parquet, or copy the data locally")
        return parquet
    path = resolve_path(location)
    if not os.path.exists(path):
        raise ConfigError(f"data source {location!r}: no such file or folder; {HINT[cfg.TASK]}")
    if forced != "auto":
        return known[forced]
    found = next((f for f in known.values() if f.detect(path)), None)
    if found is None:  # a file that is not a shard (every folder is some format's)
        raise ConfigError(f"data source {location!r} is a file but not a Parquet shard; {HINT[cfg.TASK]}")
    return found


def check_source(cfg: DataConfig) -> str:
    """The pre-flight check of a source (``DataConfig.validate`` runs it): it exists and holds what it should
    (missing path, no images, shards cut short, missing columns), one ConfigError naming the path and the fix.
    Segmentation sources list every pair and decode ``check_pairs`` of each split (sizes, label range). Returns the
    format's name."""
    fmt = detect_format(cfg)
    if cfg.TASK == SEGMENT and fmt is not digits:  # open_source checks the format as it lists (once per job)
        check_pairs(open_source(cfg), cfg.check_pairs)
    else:
        fmt.check(cfg)
    return fmt.NAME


def check_pairs(src: Source, n: int) -> tuple[int, list[tuple[str, str]]]:
    """Decode ``n`` pairs of each split (``SegList.sample``: spread evenly; Parquet shards: their first row group's);
    ConfigError naming the first that does not fit (size, labels, mask format). An unreadable or undecodable pair is
    an error under ``on_bad_image=fail``; under ``skip`` (the job skips it too) only when no sampled pair of a split
    decodes. Returns (pairs sampled, (path, why) of each skipped one)."""
    sampled, skipped = 0, []
    for split in ("train", "val"):
        found = src.split(split)
        bad, picked = [], found.sample(n)
        for i in picked:
            try:
                found.load(int(i), src.cfg.max_pixels)
            except ConfigError:
                raise
            except Exception as err:  # noqa: BLE001 — an unreadable or undecodable file
                bad.append((found.paths[int(i)], str(err)))
                if src.cfg.on_bad_image == "fail":
                    raise ConfigError(f"{bad[0][0]}: cannot read the pair ({err}); fix or remove it, or give "
                                      "--data.on_bad_image skip (`ropim data`: --on-bad-image skip)") from None
        if len(picked) and len(bad) == len(picked):
            raise none_decode(src.cfg.source, f"the {len(picked)} pairs sampled from the {split} split", bad)
        sampled, skipped = sampled + len(picked), skipped + bad
    return sampled, skipped


@contextlib.contextmanager
def one_listing(listed: dict[tuple, Source] | None = None) -> Iterator[None]:
    """Within the block (a job, on its driver and on each of its workers) each source is listed once: ``open_source``
    gives the Source it listed first for the same config. The pre-flight, the Ray dataset and every evaluation then
    see the same files, and a large folder is not walked again for each (files added meanwhile: the next job's).
    ``listed``: listings made elsewhere to start from (``listings()`` of the driver's block, handed to a worker)."""
    global LISTED
    if LISTED is not None:  # an outer block holds the listings: ``listed`` joins them where it lists more
        with LISTING:
            for key, source in (listed or {}).items():
                LISTED.setdefault(key, source)
        yield
        return
    LISTED = dict(listed or {})
    try:
        with footers.pinned():  # the shards as listed: their footers are not checked again on every use
            yield
    finally:
        LISTED = None


def listings() -> dict[tuple, Source]:
    """The sources listed so far in this ``one_listing`` block ({} outside one)."""
    return dict(LISTED or {})


def open_source(cfg: DataConfig, img_size: int = 32) -> Source:
    """The source's splits, listed (nothing decoded); ``img_size`` sizes the built-in digits' images. Inside
    ``one_listing``, the listing already made of the same source."""
    with LISTING:
        key = (cfg.resolved(), img_size)
        if LISTED is not None and key in LISTED:
            return LISTED[key]
        fmt = detect_format(cfg)
        fmt.check(cfg)
        listed = fmt.source(cfg, img_size)
        if LISTED is not None:
            LISTED[key] = listed
        return listed


def count_images(cfg: DataConfig, split: str) -> int:
    """Items in ``split`` without decoding any (bad files included; they are found when decoded)."""
    if detect_format(cfg) is digits:  # the seeded split of the labels: no torch
        return len(split_indices(digits.count(cfg), cfg.val_fraction, cfg.split_seed)[split])
    return len(open_source(cfg).split(split))


def check_batch_fits(cfg: DataConfig, batches: dict[str, int]) -> int:
    """The training split's item count, listed once (what the listing left out logged as warnings); ConfigError
    naming the flag when it holds less than one of the ``batches`` ({flag: batch size}), or naming the source when
    none of its first images decodes (``check_decodes``)."""
    src = None if detect_format(cfg) is digits else open_source(cfg)
    for note in src.notes if src is not None else []:  # what the listing left out: said once, before the job
        log.warning(f"data source {cfg.source}: {note}")
    items = None if src is None else src.split("train")
    n = count_images(cfg, "train") if items is None else len(items)
    for name, batch_size in batches.items():
        if n < batch_size:
            noun = "pairs" if cfg.TASK == SEGMENT else "images"
            raise ConfigError(f"{name}={batch_size} exceeds the training split ({n} {noun})")
    if isinstance(items, ImageList):
        check_decodes(cfg, items)
    return n


def check_decodes(cfg: DataConfig, images: ImageList | None = None) -> None:
    """ConfigError naming the source when none of the first ``PREFLIGHT_SAMPLE`` images of ``images`` (default: the
    training split; the built-in digits are not read) decodes: pre-flight's guard against a source that would give
    the job no image at all. Cheap: one row group of a Parquet shard is read, in a fraction of a second, and an
    ImageFolder is walked only up to its ``PREFLIGHT_SAMPLE``-th training image (``imagefolder.train_head``)."""
    if images is None:
        fmt = detect_format(cfg)
        if fmt is digits:
            return
        fmt.check(cfg)
        images = imagefolder.train_head(cfg, PREFLIGHT_SAMPLE) if fmt is imagefolder else \
            fmt.source(cfg).split("train")
        if len(images) == 0:  # the walk listed everything: the listing's own error (what it left out, the fix)
            fmt.source(cfg).split("train")
    sample = images.head(PREFLIGHT_SAMPLE)
    bad = undecodable(sample, cfg.max_pixels)
    if sample and len(bad) == len(sample):
        raise none_decode(cfg.source, f"the first {len(sample)} images of the training split", bad)
