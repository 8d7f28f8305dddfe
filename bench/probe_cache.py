"""What ``ropim probe --cache_dir`` costs before it can read cached features, against what the cache saves.

Measured in this run, side by side:

* listing an ImageFolder: the library's (``open_source``: one ``scandir`` per folder, only links resolved) and the
  listing it replaced (``os.walk`` + ``realpath`` and ``relpath`` of every file), which ``ropim probe`` ran twice;
* the cache key's stat pass (``FileList.fingerprint``: path, size and mtime of every file);
* feature extraction per image on the built-in digits (decode + eval transform + forward), the work the cache saves:
  the digits demo's encoder (ViT-T width, 6 blocks, 32x32) and ViT-B/16 at 224x224 (the ImageNet setting).

Then each is extrapolated to ``--target`` files (ImageNet-1k train: 1,281,167). Numbers are for the file system the
tree is on, its metadata cache warm after the first repeat (the best of ``--repeats`` is shown); point ``TREE`` at a
network file system to measure there.

    PYTHONPATH=. .venv/bin/python bench/probe_cache.py --synthetic 200000        # a temporary tree, deleted after
    PYTHONPATH=. .venv/bin/python bench/probe_cache.py PATH/TO/imagenet/train --vitb-images 0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch
from record import provenance, write_json  # bench/, beside this file

from ropim.core.backbone import encoder_spec
from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset, eval_transform
from ropim.data.formats.common import is_image
from ropim.data.sources import open_source
from ropim.eval.features import extract_features
from ropim.train.downstream import classifier_from

IMAGENET_TRAIN = 1_281_167


def make_tree(root: str, n: int, classes: int = 1000) -> None:
    """``n`` tiny files named like ImageNet's (``nXXXXXXXX/nXXXXXXXX_K.JPEG``) in ``classes`` class folders."""
    for c in range(classes):
        folder = os.path.join(root, f"n{c:08d}")
        os.makedirs(folder, exist_ok=True)
        for k in range(n // classes + (c < n % classes)):
            with open(os.path.join(folder, f"n{c:08d}_{k}.JPEG"), "wb") as f:
                f.write(b"\xff\xd8 not decoded here")


def old_listing(root: str) -> int:
    """The listing ``open_source`` used before: ``os.walk`` per class folder, ``realpath`` and ``relpath`` of each
    file (no split layout, no link checks beyond those calls: a lower bound of its cost)."""
    n = 0
    for c in sorted(e.name for e in os.scandir(root) if e.is_dir()):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, c), followlinks=True):
            os.path.realpath(dirpath)
            dirnames.sort()
            for f in sorted(filenames):
                if is_image(f):
                    os.path.realpath(os.path.join(dirpath, f))
                    os.path.relpath(os.path.join(dirpath, f), root)
                    n += 1
    return n


def best(fn, repeats: int) -> tuple[float, object]:
    """(fastest wall time of ``repeats`` calls, the last result)."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def extraction(arch: str, img_size: int, patch: int, depth: int | None, n: int) -> float:
    """Seconds per image to decode, transform and encode ``n`` digits (batch 64, random weights, this CPU)."""
    name, kwargs = encoder_spec("beit", arch, img_size=img_size, patch_size=patch, depth=depth)
    encoder = classifier_from({"arch": name, "timm_kwargs": kwargs}, None, 0, img_size, quiet=True)
    data = build_dataset(DataConfig("digits"), "train", eval_transform(img_size), img_size)
    extract_features(encoder, torch.utils.data.Subset(data, range(8)), 8, "cpu")  # warm-up
    start = time.perf_counter()
    extract_features(encoder, torch.utils.data.Subset(data, range(n)), 64, "cpu")
    return (time.perf_counter() - start) / n


def measure(tree: str, repeats: int, digits_images: int, vitb_images: int) -> dict:
    """Every number of the table, measured on ``tree``."""
    cfg = DataConfig(tree)
    t_list, items = best(lambda: open_source(cfg).split(None), repeats)
    t_old, n_old = best(lambda: old_listing(tree), repeats)
    t_fp, _ = best(items.fingerprint, repeats)
    out = {"files": len(items), "old_listing_files": n_old, "list_s": t_list, "old_list_s": t_old,
           "fingerprint_s": t_fp, "threads": torch.get_num_threads(),
           "extract_digits_demo_s_per_img": extraction("vit_tiny_patch16_224", 32, 8, 6, digits_images)}
    if vitb_images:
        out["extract_vit_b16_224_s_per_img"] = extraction("vit_base_patch16_224", 224, 16, None, vitb_images)
    return out


def table(r: dict, target: int) -> str:
    """The human table: per file, and extrapolated to ``target`` files."""
    n = r["files"]
    rows = [("listing, before (probe ran it twice)", r["old_list_s"] / n), ("listing, now (once)", r["list_s"] / n),
            ("cache key: stat of every file", r["fingerprint_s"] / n),
            ("extraction, digits demo encoder (32x32)", r["extract_digits_demo_s_per_img"])]
    if "extract_vit_b16_224_s_per_img" in r:
        rows.append(("extraction, ViT-B/16 at 224 (CPU)", r["extract_vit_b16_224_s_per_img"]))
    lines = [f"{n:,} files; extrapolated to {target:,} ({r['threads']} torch threads)",
             f"{'step':<42}{'µs / file':>12}{'s at target':>14}"]
    lines += [f"{name:<42}{per * 1e6:>12.1f}{per * target:>14.1f}" for name, per in rows]
    before = 2 * r["old_list_s"] / n + r["fingerprint_s"] / n
    now = r["list_s"] / n + r["fingerprint_s"] / n
    lines.append(f"probe's cost before reading the cache: {before * target:.1f} s before, {now * target:.1f} s now; "
                 f"extraction it saves: {r['extract_digits_demo_s_per_img'] * target:.0f} s (digits demo encoder)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", nargs="?", help="an ImageFolder (ROOT/<class>/<image>) to measure")
    parser.add_argument("--synthetic", type=int, default=0, help="measure a temporary tree of N tiny files instead")
    parser.add_argument("--target", type=int, default=IMAGENET_TRAIN, help="files to extrapolate to")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--digits-images", type=int, default=1024)
    parser.add_argument("--vitb-images", type=int, default=32, help="0: skip ViT-B/16 (slow on a CPU)")
    parser.add_argument("--out", help="also write the numbers as JSON here")
    args = parser.parse_args()
    t0 = time.perf_counter()
    if bool(args.tree) == bool(args.synthetic):
        parser.error("give TREE or --synthetic N")
    tmp = tempfile.mkdtemp(prefix="ropim-probe-cache-") if args.synthetic else None
    try:
        if tmp:
            make_tree(tmp, args.synthetic)
        result = measure(tmp or args.tree, args.repeats, args.digits_images, args.vitb_images)
    finally:
        if tmp:
            shutil.rmtree(tmp)
    result.update(target=args.target, **provenance("bench/probe_cache.py", None, t0))
    print(table(result, args.target))
    print(json.dumps(result))
    if args.out:
        write_json(result, Path(args.out))


if __name__ == "__main__":
    main()
