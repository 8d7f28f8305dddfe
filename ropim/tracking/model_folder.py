"""A model held in a local folder (``<kind>.safetensors`` + ``config.json``): found and checked whole from its files
alone, without MLflow or torch, so that a wrong folder fails in a fraction of a second."""

from __future__ import annotations

import json
from pathlib import Path

from ropim.errors import ConfigError
from ropim.paths import is_uri
from ropim.tracking.names import DEFAULT_CLASSIFIER_NAME, DEFAULT_ENCODER_NAME, DEFAULT_SEGMENTER_NAME
from ropim.tracking.uri import ModelRef

MODEL_KINDS = ("encoder", "classifier", "segmenter")
DEFAULT_NAMES = {"encoder": DEFAULT_ENCODER_NAME, "classifier": DEFAULT_CLASSIFIER_NAME,
                 "segmenter": DEFAULT_SEGMENTER_NAME}


class MixedKinds(ConfigError):
    """``--registered_model NAME`` names a registered model holding versions of another kind than the one a job
    registers: one registered model holds one kind (its versions' ``kind`` tag). ``held``: {kind: versions};
    ``suggested``: a name to register into instead."""

    def __init__(self, name: str, kind: str, held: dict[str, list[str]]) -> None:
        self.name, self.kind, self.held = name, kind, held
        self.suggested = DEFAULT_NAMES[kind] if DEFAULT_NAMES[kind] != name else f"{name}-{kind}"
        kinds = " and ".join(f"{k}s ({versions_text(v)})" for k, v in sorted(held.items()))
        self.found = f"registered_model={name} holds {kinds}"
        super().__init__(f"{self.found}: one registered model holds one kind; give the {kind} another "
                         f"--registered_model (e.g. {self.suggested}), or --registered_model \"\" to register nothing")


def versions_text(versions: list[str]) -> str:
    """``v1, v2`` (at most three named, then how many in all)."""
    shown = ", ".join(f"v{v}" for v in versions[:3])
    return shown if len(versions) <= 3 else f"{shown}, … {len(versions)} versions"


def check_local_model(model_uri: str, kind: str) -> Path | None:
    """The local path ``model_uri`` names, its ``kind``'s files whole when it is a folder; None for a URI for MLflow
    (``models:/…``, ``runs:/…``, a scheme); one clear error for a folder that is not there."""
    local = Path(model_uri).expanduser()
    if local.exists():
        if local.is_dir():
            model_files(local, kind, model_uri)
        return local
    if not ModelRef.parse(model_uri).in_store and not is_uri(model_uri):
        raise FileNotFoundError(
            f"{kind} {model_uri}: no such local folder; give a folder holding {kind}.safetensors + config.json, "
            "models:/name/version, models:/name@alias or runs:/<run_id>/<artifact path>"
        )
    return None


def wrong_kind(model_uri: str, kind: str, other: str) -> ConfigError:
    """The one error for a model of kind ``other`` (a folder's files, a registered version's tags) given where a
    ``kind`` is expected."""
    return ConfigError(f"{kind} {model_uri}: this is a {other}, where {kind} weights are expected; give the {kind} "
                       f"(models:/ropim-{kind}/VERSION, @alias, runs:/… or a folder with {kind}.safetensors)")


def safetensors_problem(path: Path) -> str | None:
    """Why ``path`` is not a whole safetensors file, judged from its header and size (no tensor is read), or None."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or 8 + n > size:
            return f"{size:,} bytes: shorter than its header"
        try:
            header = json.loads(f.read(n))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, AttributeError):
            return "its header is not a safetensors header"
    return None if 8 + n + end == size else f"{size:,} bytes where its header promises {8 + n + end:,}"


def holding(folder: Path, kind: str) -> Path | None:
    """Where ``folder`` holds a ``kind``'s weights: in itself, or in ``artifacts/`` (an MLflow model's folder, as
    downloaded or exported); None when neither does. Never deeper, so that the weights and the config beside them
    are one model's."""
    return next((f for f in (folder, folder / "artifacts") if (f / f"{kind}.safetensors").is_file()), None)


def model_files(folder: Path, kind: str, model_uri: str) -> tuple[Path, Path]:
    """(``<kind>.safetensors``, ``config.json``) side by side in ``folder`` (``holding``), both whole: one error naming
    a file missing, cut short or damaged."""
    found = holding(folder, kind)
    if found is None or not (found / "config.json").is_file():
        other = next((k for k in MODEL_KINDS if k != kind and holding(folder, k)), None)
        if found is None and other is not None:
            raise wrong_kind(model_uri, kind, other)
        where = f"{found}: {kind}.safetensors without config.json beside it" if found else \
            f"no {kind}.safetensors + config.json in {folder} (or its artifacts/ folder)"
        raise FileNotFoundError(f"{kind} {model_uri}: {where}; give the folder that holds both")
    weights, cfg_file = found / f"{kind}.safetensors", found / "config.json"
    damaged, problem = weights, safetensors_problem(weights)
    if problem is None:
        try:
            json.loads(cfg_file.read_text())
        except (ValueError, OSError) as err:
            damaged, problem = cfg_file, f"not JSON: {err}"
    if problem is not None:
        raise ConfigError(f"{kind} {model_uri}: {damaged} cannot be read ({problem}); it is cut short or damaged: "
                          "copy or export the model again (or register it again)")
    return weights, cfg_file
