"""The registry from the terminal: ``ropim models list`` (a table of registered versions) and ``ropim models show``
(one version's card with its aliases and lineage)."""

from __future__ import annotations

import json
import time

from mlflow.entities.model_registry import ModelVersion

from ropim.tracking.cards import card, first_stage, kind_of, scores
from ropim.tracking.registry import local_copy, resolve_version
from ropim.tracking.store import client

COLUMNS = ("version", "created", "run", "stage", "dataset", "corruption", "rho", "backbone", "epochs", "scores",
           "aliases")


def row(mv: ModelVersion, aliases: list[str]) -> dict[str, str]:
    """One line of ``ropim models list``."""
    t = mv.tags or {}
    return {
        "version": str(mv.version),
        "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(mv.creation_timestamp / 1000)),
        "run": (mv.run_id or "")[:8], "stage": t.get("stage", ""), "dataset": t.get("dataset", ""),
        "corruption": t.get("corruption", ""),
        "rho": f"{float(t['rho']):.3g}" if t.get("rho") else "", "backbone": t.get("backbone", "vit" if t else ""),
        "epochs": t.get("epochs", ""), "scores": "; ".join(f"{k} {v}" for k, v in scores(t).items()) or "—",
        "aliases": ", ".join(aliases),
    }


def aliases_of(name: str, uri: str | None = None) -> dict[str, list[str]]:
    """{version: [aliases]} of registered model ``name``."""
    out: dict[str, list[str]] = {}
    for alias, version in (client(uri).get_registered_model(name).aliases or {}).items():
        out.setdefault(str(version), []).append(alias)
    return out


def table(rows: list[dict[str, str]]) -> str:
    """Rows as an aligned plain-text table."""
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in COLUMNS)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in COLUMNS) for r in rows]
    return "\n".join(lines)


def list_versions(name: str, uri: str | None = None) -> str:
    """``ropim models list``: every version of ``name``, newest first."""
    versions = sorted(client(uri).search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version))
    if not versions:
        return f"no registered versions of {name!r}"
    aliases = aliases_of(name, uri)
    return table([row(v, aliases.get(str(v.version), [])) for v in versions])


def runs_from(mv: ModelVersion, experiment: str, metric: str, label: str, uri: str | None = None) -> list[str]:
    """The runs of ``experiment`` that started from registered version ``mv``, with their ``metric`` (the from-scratch
    baselines, which took only its architecture, left out)."""
    c = client(uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    found = c.search_runs([exp.experiment_id], filter_string=f"tags.`ropim.encoder_name` = '{mv.name}' and "
                                                             f"tags.`ropim.encoder_version` = '{mv.version}'")
    return [f"{r.info.run_name} ({r.info.run_id[:8]}, {label} {r.data.metrics.get(metric, float('nan')):.2f})"
            for r in found if not r.data.tags.get("ropim.kind", "").endswith("random-init")]


def lineage(mv: ModelVersion, uri: str | None = None) -> dict[str, list[str]]:
    """A registered encoder version: the run that trained it, the version it started from (a second stage), the
    sweep, and the fine-tunes, segmentations and grafts made from it; a classifier or segmenter version: its run and
    the encoder it started from."""
    t = mv.tags or {}
    if kind_of(t) != "encoder":
        run = "segmentation run" if kind_of(t) == "segmenter" else "fine-tune run"
        return {run: [mv.run_id] if mv.run_id else [], "encoder": [t.get("encoder_uri", "?")]}
    run = f"{t['stage']} run" if t.get("stage") else "pretraining run"
    return {run: [mv.run_id] if mv.run_id else [], **first_stage(t), "sweep": [t["sweep"]] if t.get("sweep") else [],
            "fine-tunes": runs_from(mv, "ropim-finetune", "top1", "top-1", uri),
            "segmentations": runs_from(mv, "ropim-segment", "miou", "mIoU", uri),
            "grafts": runs_from(mv, "ropim-graft", "knn_top1", "kNN top-1", uri)}


def show(model_uri: str, uri: str | None = None) -> str:
    """``ropim models show URI``: the card of a ``models:/name/version`` or ``models:/name@alias``."""
    name, version = resolve_version(model_uri, uri) or (None, None)
    if name is None:
        raise LookupError(f"{model_uri}: give models:/name/version or models:/name@alias")
    mv = client(uri).get_model_version(name, version)
    with local_copy(f"models:/{name}/{version}", kind_of(mv.tags or {}), uri) as folder:
        found = next(folder.rglob("config.json"), None)
        if found is None:
            raise LookupError(f"{model_uri}: not a ropim model (version {version} of {name!r} holds no config.json); "
                              "`ropim models show` reads ropim's encoders, classifiers and segmenters")
        config = json.loads(found.read_text())
    aliases = aliases_of(name, uri).get(str(version), [])
    head = f"aliases: {', '.join(aliases) or '—'}\n\n"
    return head + card(name, version, config, mv.tags or {}, lineage(mv, uri))
