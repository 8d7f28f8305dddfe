"""Search spaces as plain JSON-able specs, their Ray Tune form, and how a trial's values enter a PretrainConfig.

A spec maps a knob to one distribution::

    {"rho": {"grid": [0.07, 0.14, 0.25, 0.5]}}
    {"rho": {"uniform": [0.05, 0.6]}, "base_lr": {"loguniform": [5e-4, 2e-2]}, "epochs": {"choice": [2, 4, 8]}}

Knobs are dotted PretrainConfig fields (``model.rho``, ``base_lr``, ``epochs``, ``seed``, …); ``rho`` is short
for ``model.rho``. Specs stay plain data so a sweep's config can be stored, compared on resume and logged.
"""

from __future__ import annotations

import copy
import math

from ropim.errors import ConfigError

KINDS = ("grid", "choice", "uniform", "loguniform")
ALIASES = {"rho": "model.rho"}


def field_path(knob: str) -> list[str]:
    """``'rho'`` -> ``['model', 'rho']``; ``'base_lr'`` -> ``['base_lr']``."""
    return ALIASES.get(knob, knob).split(".")


def validate_space(space: dict, search: str, pretrain: dict) -> dict:
    """Raise ConfigError on a malformed spec, a knob PretrainConfig lacks, or a grid inside a TPE search."""
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"space={space!r}: give at least one knob, e.g. {{\"rho\": {{\"grid\": [0.07, 0.14]}}}}")
    for knob, dist in space.items():
        node = pretrain
        for part in field_path(knob):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"space knob {knob!r}: not a pretraining config field (e.g. rho, base_lr, epochs)")
            node = node[part]
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in KINDS:
            raise ConfigError(f"space knob {knob!r}: {dist!r} must be {{KIND: [...]}}, KIND one of {', '.join(KINDS)}")
        kind, args = next(iter(dist.items()))
        if not isinstance(args, list) or not args:
            raise ConfigError(f"space knob {knob!r}: {kind} needs a non-empty list")
        ranged = kind in ("uniform", "loguniform")
        if ranged and (len(args) != 2 or not args[0] < args[1] or (kind == "loguniform" and args[0] <= 0)):
            raise ConfigError(f"space knob {knob!r}: {kind} needs [low, high] with 0 < low < high")
        if kind == "grid" and search != "grid":
            raise ConfigError(f"space knob {knob!r}: grid values need search=grid (TPE samples; use choice)")
        if knob in ("rho", "model.rho"):
            lo, hi = (min(args), max(args)) if kind != "uniform" else args
            if not 0 < lo <= hi < 1:
                raise ConfigError(f"space knob rho: values must lie in (0, 1), got {args}")
    return space


def to_tune(space: dict) -> dict:
    """The spec as a Ray Tune ``param_space``."""
    from ray import tune

    make = {"grid": tune.grid_search, "choice": tune.choice,
            "uniform": lambda a: tune.uniform(*a), "loguniform": lambda a: tune.loguniform(*a)}
    return {knob: make[kind](list(args)) for knob, dist in space.items() for kind, args in dist.items()}


def n_grid_points(space: dict) -> int:
    """Trials one sample of the space expands to (the product of grid sizes; 1 without grids)."""
    return math.prod(len(args) for dist in space.values() for kind, args in dist.items() if kind == "grid")


def max_value(space: dict, knob: str, default):
    """The largest value ``knob`` can take (e.g. the most epochs, for ASHA's max_t)."""
    dist = space.get(knob)
    return default if dist is None else max(next(iter(dist.values())))


def apply_trial(pretrain: dict, trial: dict) -> dict:
    """A copy of the pretraining config dict with the trial's knob values set."""
    out = copy.deepcopy(pretrain)
    for knob, value in trial.items():
        *parents, leaf = field_path(knob)
        node = out
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise ConfigError(f"trial knob {knob!r}: not a pretraining config field")
        node[leaf] = value
    return out


def grid_seeds(space: dict, base_seed: int, n: int) -> dict:
    """A grid space with ``n`` seeds per point (``seed`` added as a grid knob), for repeated grid trials."""
    if n <= 1 or "seed" in space:
        return space
    return {**space, "seed": {"grid": list(range(base_seed, base_seed + n))}}
