"""``ropim data inspect PATH``: format, images per split, classes, image size statistics of a source and how many of
its images do not decode, in a sample."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
from PIL import Image

from ropim.data.blocks import mixing_note
from ropim.data.config import DataConfig, SegDataConfig
from ropim.data.decode import none_decode, undecodable
from ropim.data.formats.common import Source
from ropim.data.formats.parquet_rows import KEPT_FILES, ParquetList, ShardRows
from ropim.data.sources import check_pairs, open_source
from ropim.errors import ConfigError


def _size(data: bytes | np.ndarray) -> tuple[int, int, str] | None:
    """(width, height, mode) from the header only; None when unreadable."""
    if isinstance(data, np.ndarray):
        return data.shape[1], data.shape[0], "RGB"
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.width, img.height, img.mode
    except Exception:  # noqa: BLE001 — an unreadable header is just left out of the statistics
        return None


def inspect_source(cfg: DataConfig, sample: int = 200) -> dict:
    """A summary of the source: format, split rule, images per split, classes, sizes of ``sample`` images, how
    many of them do not decode, and notes (classes without images, links not followed).

    Up to ``sample`` images spread over both splits are decoded (over the first two shards of each split for
    Parquet, so a remote data set is not read whole); sizes and modes come from their headers. ConfigError naming
    the source when none of them decodes.
    """
    if sample < 1:
        raise ConfigError(f"--sample {sample}: must be ≥ 1 (the images whose sizes are read)")
    cfg = cfg.resolved().validate()
    src = open_source(cfg)
    splits = {s: src.split(s, cache_files=1) for s in ("train", "val")}
    total = sum(len(v) for v in splits.values())
    picked = []
    for images in splits.values():
        span = int(images.offsets[min(2, len(images.files))]) if isinstance(images, ParquetList) else len(images)
        k = min(span, max(1, round(sample * len(images) / total)))
        for i in np.unique(np.linspace(0, span - 1, k).astype(int)):
            try:
                picked.append((images.paths[i], images.load(int(i))))
            except OSError:
                picked.append((images.paths[i], None))
    bad = undecodable(picked, cfg.max_pixels)
    if picked and len(bad) == len(picked):
        raise none_decode(cfg.source, f"the {len(picked)} images sampled", bad)
    sizes = [s for s in (_size(data) for _, data in picked if data is not None) if s]
    w = np.array([s[0] for s in sizes]) if sizes else np.zeros(0)
    h = np.array([s[1] for s in sizes]) if sizes else np.zeros(0)
    modes = sorted({s[2] for s in sizes})

    def stats(a):
        return {"min": int(a.min()), "mean": float(a.mean()), "max": int(a.max())} if len(a) else {}

    rule = split_rule(src)
    counts = sum(np.bincount(v.labels, minlength=len(src.classes)) for v in splits.values())
    empty = [c for c, n in zip(src.classes, counts, strict=True) if not n]
    some = ", ".join(empty[:8]) + (", …" if len(empty) > 8 else "")
    notes = src.notes + ([f"{len(empty)} of the {len(src.classes)} classes hold no image ({some}): a classifier gets "
                          "an output it never learns; remove such folders if they are not classes"] if empty else [])
    notes += [note] if (note := mixing_note(splits["train"])) else []  # shards in class order
    return {
        "format": src.format, "location": src.location, "split": rule,
        "images": {s: len(v) for s, v in splits.items()},
        "num_classes": len(src.classes), "classes": list(src.classes),
        "image_size": {"sampled": len(sizes), "width": stats(w), "height": stats(h), "modes": modes},
        "undecodable": {"sampled": len(picked), "count": len(bad), "first": [f"{p}: {why}" for p, why in bad[:5]]},
        "notes": notes,
        **shards_info(splits["train"]),  # what training's processes keep
    }


def split_rule(src: Source) -> str:
    """How the source's items fall into train and val: its own split, or the seeded fraction."""
    return "own" if src.own_split else f"seeded fraction {src.cfg.val_fraction} (seed {src.cfg.split_seed})"


def shards_info(train: object) -> dict:
    """{"shards": the training split's shard count and what a loader process keeps of them} for Parquet shards;
    {} otherwise."""
    if not isinstance(train, ShardRows):
        return {}
    return {"shards": {"train": len(train.files), "kept_bytes": train.kept_bytes(KEPT_FILES), "kept_files": KEPT_FILES,
                       "holding": " and ".join(f"{c}s" for c in train.COLUMNS)}}


def shards_line(shards: dict) -> str:
    """The line of ``shards_info``'s: what a loader process keeps."""
    return (f"shards      train {shards['train']:,}; a loader process keeps up to {shards['kept_files']} of them: "
            f"{shards['kept_bytes'] / 2**20:,.1f} MiB of {shards['holding']} (× --dataloader_workers × the workers on "
            "a node)")


def format_summary(info: dict, n_names: int = 8) -> str:
    """The human-readable lines ``ropim data inspect`` prints."""
    names = ", ".join(info["classes"][:n_names]) + (", …" if info["num_classes"] > n_names else "")
    size = info["image_size"]
    lines = [
        f"format      {info['format']}  ({info['location']})",
        "images      " + "  ".join(f"{s} {n:,}" for s, n in info["images"].items())
        + f"  (split: {info['split']})",
        f"classes     {info['num_classes']}: {names}",
    ]
    if size["sampled"]:
        w, h = size["width"], size["height"]
        lines.append(f"image size  {size['sampled']} sampled: width {w['min']}–{w['max']} (mean {w['mean']:.1f}), "
                     f"height {h['min']}–{h['max']} (mean {h['mean']:.1f}); modes {', '.join(size['modes'])}")
    bad = info["undecodable"]
    lines.append(f"undecodable {bad['count']} of {bad['sampled']} sampled"
                 + (f" (first: {bad['first'][0]}); training skips such images (data.on_bad_image=skip, the "
                    "default), `ropim data convert` drops them" if bad["count"] else ""))
    if shards := info.get("shards"):
        lines.append(shards_line(shards))
    lines += [f"note        {note}" for note in info.get("notes", [])]
    return "\n".join(lines)


def pairs_summary(cfg: SegDataConfig) -> str:
    """The lines ``ropim data inspect --task segment`` prints: format, pairs per split, classes, and notes (links
    not followed, pairs that do not decode). Every pair is listed and ``cfg.check_pairs`` of each split decoded,
    once: here (``validate``'s own sample left out), to count the pairs it skips."""
    src = open_source(replace(cfg.resolved(), check_pairs=0).validate())
    pairs = "  ".join(f"{s} {len(src.split(s)):,}" for s in ("train", "val"))
    lines = [f"{src.location}: format {src.format}; pairs: {pairs} (split: {split_rule(src)}); "
             f"{len(src.classes)} classes ({', '.join(src.classes[:8])}{', …' if len(src.classes) > 8 else ''})"]
    if shards := shards_info(src.split("train", cache_files=1)).get("shards"):
        lines.append(shards_line(shards))
    sampled, bad = check_pairs(src, cfg.check_pairs) if src.format != "digits" else (0, [])
    if bad:
        lines.append(f"undecodable {len(bad)} of {sampled} sampled pairs (first: {bad[0][0]}: {bad[0][1]}); training "
                     "skips such pairs (data.on_bad_image=skip, the default), `ropim data convert` drops them")
    return "\n".join(lines + [f"note        {note}" for note in src.notes])
