"""The champion rule: which registered encoder version holds ``champion``, ``champion-<dataset>`` and
``champion-<width><patch>-<size>`` (``ropim.tracking.names.model_alias``)."""

from __future__ import annotations

import hashlib
import re
import time

import mlflow

from ropim.paths import recorded_location
from ropim.tracking.names import CHAMPION, model_alias
from ropim.tracking.store import RetryingClient, client

SCORE_TAGS = ("metric", "metric_dataset", "metric_value")


def dataset_alias(dataset: str, alias: str = CHAMPION) -> str:
    """The per-dataset alias, e.g. ``champion-digits``; paths use their last part plus a short hash."""
    if re.fullmatch(r"[A-Za-z0-9_]+", dataset):
        return f"{alias}-{dataset}"
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", dataset.rstrip("/").split("?")[0].rsplit("/", 1)[-1]).strip("_")
    return f"{alias}-{stem or 'data'}-{hashlib.sha1(dataset.encode()).hexdigest()[:6]}"


def shape_key(width: str, patch_size: int, img_size: int) -> str:
    """An encoder's shape as its per-shape alias names it, e.g. ``vit_t4-32``."""
    return model_alias(width, int(patch_size), int(img_size)).removeprefix(f"{CHAMPION}-")


def shape_of(tags: dict[str, str]) -> str | None:
    """A version's shape: its ``shape`` tag (set by ``promote_champion``), else its config tags ``width``,
    ``patch_size`` and ``img_size`` (every registered encoder has them); None when unknown."""
    if tags.get("shape"):
        return tags["shape"]
    try:
        return shape_key(tags["width"], int(tags["patch_size"]), int(tags["img_size"]))
    except (KeyError, ValueError):
        return None


def holder_of(c: RetryingClient, name: str, alias: str):
    """The version holding ``alias`` of ``name``, or None when none does; any other error of the store (a server
    down after its retries) is raised, never read as a free alias that moves without a comparison."""
    try:
        return c.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as err:
        if err.error_code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"):  # no such alias, or model
            return None
        raise


def challenge(c: RetryingClient, name: str, version: str, alias: str, metric: str, dataset: str, value: float,
              higher_is_better: bool, shape: str | None = None) -> tuple[bool, str]:
    """Whether ``version`` (``metric`` = ``value`` on ``dataset``) takes ``alias``, and why (one line). ``shape``: the
    shape a per-shape alias is for; its holder of another shape (never right) gives it up."""
    holder = holder_of(c, name, alias)
    if holder is None:
        return True, f"no version held {alias!r}"
    if str(holder.version) == str(version):
        return True, f"v{version} already holds {alias!r}"
    tags = holder.tags or {}
    if any(tags.get(k) is None for k in SCORE_TAGS):
        return False, f"{alias!r} is v{holder.version}, which has no metric/dataset tags to compare against"
    held = shape_of(tags)
    if shape is not None and held is not None and held != shape:
        return True, f"{alias!r} was v{holder.version}, an encoder of another shape ({held})"
    if recorded_location(tags["metric_dataset"]) != dataset:
        return False, f"{alias!r} is v{holder.version} on another dataset ({tags['metric_dataset']})"
    if metric.startswith(f"{tags['metric']}@recipe="):  # registered before a downstream score named its recipe
        return True, f"{alias!r} was v{holder.version}, scored by {tags['metric']} under a recipe not recorded"
    if tags["metric"] != metric:
        return False, f"{alias!r} is v{holder.version} scored by another metric ({tags['metric']})"
    current = float(tags["metric_value"])
    better = value > current if higher_is_better else value < current
    verdict = "beats" if better else "does not beat"
    return better, f"{metric} {value:.4g} {verdict} v{holder.version}'s {current:.4g} on {dataset}"


def promote_champion(name: str, version: str, metric: str, dataset: str, value: float,
                     higher_is_better: bool = True, uri: str | None = None,
                     alias: str = CHAMPION, model: tuple[str, int, int] | None = None) -> dict[str, tuple[bool, str]]:
    """Tag version ``version`` with its score and move the aliases it wins; return {alias: (moved, reason)}, where
    ``moved`` says whether ``version`` holds the alias once settled.

    The version gets tags ``metric``, ``metric_dataset``, ``metric_value`` (and, given ``model`` = (width, patch
    size, image size), ``shape``, e.g. ``vit_t4-32``). These aliases are challenged: ``alias`` (``champion``, what a
    fine-tune without a preset loads by default), the per-dataset ``dataset_alias(dataset)`` and, given ``model``, the
    per-shape ``model_alias(*model)`` that the paper presets load, which only ever holds a version of that shape.
    Each moves only when nobody holds it or the holder was scored on the same metric and dataset and the new
    value is strictly better; a holder from another dataset or metric (or without score tags) keeps it.
    Each decision is stored as a version tag ``alias.<alias>``. ``dataset`` is compared and stored as
    ``ropim.paths.recorded_location`` gives it: a path inside Ray's copy of a ``ray job submit --working-dir`` folder
    as ``working_dir:<relative path>``, one data set whatever copy a job ran in (a version scored in such a copy
    before is read the same way).

    MLflow has no compare-and-set, so two promotions finishing together could each read the old holder and the
    worse one set its alias last. Every promotion therefore tags its score first, then ``settle``s: it re-reads and
    moves each alias to the best version scored on the holder's metric and data set (of the alias's shape, for a
    per-shape alias) until a pass changes nothing. Whichever promotion writes last has read every score tagged
    before, so the better encoder ends up holding both aliases. The decisions returned say where each alias settled.
    """
    c = client(uri)
    version, dataset = str(version), recorded_location(dataset)
    shape = shape_key(*model) if model is not None else None
    scores = {"metric": metric, "metric_dataset": dataset, "metric_value": repr(float(value))}
    for k, v in {**scores, **({"shape": shape} if shape else {})}.items():
        c.set_model_version_tag(name, version, k, v)
    shapes = {alias: None, dataset_alias(dataset, alias): None, **({model_alias(*model, alias=alias): shape}
                                                                   if model is not None else {})}
    decisions = {}
    for a, s in shapes.items():
        moved, reason = challenge(c, name, version, a, metric, dataset, float(value), higher_is_better, s)
        if moved:
            set_alias(c, name, a, version)
        decisions[a] = (moved, reason)
        record(c, name, version, a, moved, reason)
    settle(c, name, shapes, higher_is_better)
    return settled(c, name, version, decisions)


def record(c: RetryingClient, name: str, version: str, alias: str, moved: bool, reason: str) -> None:
    """Store one decision on the version as tag ``alias.<alias>``."""
    c.set_model_version_tag(name, version, f"alias.{alias}", ("moved here: " if moved else "not moved: ") + reason)


def settled(c: RetryingClient, name: str, version: str,
            decisions: dict[str, tuple[bool, str]]) -> dict[str, tuple[bool, str]]:
    """``decisions`` made true after ``settle``: each says whether ``version`` holds its alias now (a concurrent
    promotion may have settled it elsewhere, or here); a changed one is stored again."""
    out = {}
    for a, (moved, reason) in decisions.items():
        held = holder_of(c, name, a)
        holder = str(held.version) if held is not None else None
        now = holder == version
        if now != moved:
            where = "here" if now else f"on v{holder}" if holder else "nowhere (removed)"
            reason = f"{reason}, but it settled {where} once every version's score was re-read"
            record(c, name, version, a, now, reason)
        out[a] = (now, reason)
    return out


def set_alias(c: RetryingClient, name: str, alias: str, version: str, tries: int = 5) -> None:
    """Point ``alias`` at ``version``; retried, since the store may refuse two concurrent writes of one alias (the
    sqlite store inserts after a read and fails the unique constraint)."""
    for attempt in range(tries):
        try:
            c.set_registered_model_alias(name, alias, version)
            return
        except Exception:  # noqa: BLE001 — the store's integrity error surfaces as whatever its driver raises
            if attempt + 1 == tries:
                raise
            time.sleep(0.05 * (attempt + 1))


def best_version(c: RetryingClient, name: str, metric: str, dataset: str, higher_is_better: bool,
                 shape: str | None = None) -> str | None:
    """The version of ``name`` with the best ``metric`` on ``dataset`` (ties: the earliest version), or None;
    given ``shape``, only versions of that shape (``shape_of``) count."""
    sign = 1 if higher_is_better else -1
    scored = [v for v in c.search_model_versions(f"name='{name}'")
              if (v.tags or {}).get("metric") == metric and recorded_location(v.tags.get("metric_dataset")) == dataset
              and v.tags.get("metric_value") is not None and (shape is None or shape_of(v.tags) == shape)]
    if not scored:
        return None
    return str(max(scored, key=lambda v: (sign * float(v.tags["metric_value"]), -int(v.version))).version)


def settle(c: RetryingClient, name: str, aliases: dict[str, str | None], higher_is_better: bool,
           pause_s: float = 0.2, max_passes: int = 20) -> None:
    """Move each alias to the best version on its holder's metric and data set until a pass changes nothing;
    ``aliases``: {alias: the shape it is for, None for any}. A holder without score tags (set by hand), or of
    unknown or another shape for a per-shape alias, keeps it (``challenge`` decides those)."""
    for _ in range(max_passes):
        changed = False
        for a, shape in aliases.items():
            holder = holder_of(c, name, a)
            if holder is None:
                continue
            tags = holder.tags or {}
            if not set(SCORE_TAGS) <= set(tags) or (shape is not None and shape_of(tags) != shape):
                continue
            best = best_version(c, name, tags["metric"], recorded_location(tags["metric_dataset"]), higher_is_better,
                                shape)
            if best is not None and best != str(holder.version):
                set_alias(c, name, a, best)
                changed = True
        if not changed:
            return
        time.sleep(pause_s)
