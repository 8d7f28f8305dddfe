"""Search spaces as plain JSON-able specs, their Ray Tune form, and how a trial's values enter a PretrainConfig.

A spec maps a knob to one distribution::

    {"rho": {"grid": [0.07, 0.14, 0.25, 0.5]}}
    {"rho": {"uniform": [0.05, 0.6]}, "base_lr": {"loguniform": [5e-4, 2e-2]}, "epochs": {"choice": [20, 40]}}

Knobs are dotted PretrainConfig fields (``model.rho``, ``base_lr``, ``epochs``, ``seed``, …); ``rho`` is short
for ``model.rho``. Specs stay plain data so a sweep's config can be stored, compared on resume and logged.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import typing
from types import NoneType
from typing import Literal

from ropim.errors import ConfigError
from ropim.train.pretrain.config import PretrainConfig

KINDS = ("grid", "choice", "uniform", "loguniform")
RANGES = ("uniform", "loguniform")  # continuous: real numbers only
TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", NoneType: "null"}
ALIASES = {"rho": "model.rho"}


def field_path(knob: str) -> list[str]:
    """``'rho'`` -> ``['model', 'rho']``; ``'base_lr'`` -> ``['base_lr']``."""
    return ALIASES.get(knob, knob).split(".")


def validate_space(space: dict, search: str, pretrain: dict) -> dict:
    """Raise ConfigError on a malformed spec, a knob that is no single PretrainConfig setting, a value of another type
    than the setting's, a range over a whole-number setting, or a grid inside a TPE search."""
    if not isinstance(space, dict) or not space:
        raise ConfigError(f"space={space!r}: give at least one knob, e.g. {{\"rho\": {{\"grid\": [0.07, 0.14]}}}}")
    for knob, dist in space.items():
        current = setting(knob, pretrain)
        if not isinstance(dist, dict) or len(dist) != 1 or next(iter(dist)) not in KINDS:
            raise ConfigError(f"space knob {knob!r}: {dist!r} must be {{KIND: [...]}}, KIND one of {', '.join(KINDS)}")
        kind, args = next(iter(dist.items()))
        if not isinstance(args, list) or not args:
            raise ConfigError(f"space knob {knob!r}: {kind} needs a non-empty list")
        if kind in RANGES:
            check_range(knob, kind, args)
        else:
            check_values(knob, kind, args, current)
        if kind == "grid" and search != "grid":
            raise ConfigError(f"space knob {knob!r}: grid values need search=grid (TPE samples; use choice)")
        if knob in ("rho", "model.rho"):
            lo, hi = (min(args), max(args)) if kind != "uniform" else args
            if not 0 < lo <= hi < 1:
                raise ConfigError(f"space knob rho: values must lie in (0, 1), got {args}")
    return space


def setting(knob: str, pretrain: dict) -> object:
    """The current value of the one pretraining setting ``knob`` names; ConfigError for no field or a section."""
    node = pretrain
    for part in field_path(knob):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"space knob {knob!r}: not a pretraining config field (e.g. rho, base_lr, epochs)")
        node = node[part]
    if isinstance(node, dict):
        raise ConfigError(f"space knob {knob!r}: a section of the pretraining config, not one setting; name one of "
                          f"its settings, e.g. {knob}.{next(iter(node), 'NAME')}")
    return node


@functools.cache
def value_types(knob: str) -> tuple[type, ...]:
    """The types a value of the setting ``knob`` may have, by PretrainConfig's declarations (``()``: not declared)."""
    hint: object = PretrainConfig
    for part in field_path(knob):
        hint = typing.get_type_hints(hint).get(part) if dataclasses.is_dataclass(hint) else None
    return types_of(hint)


def types_of(hint: object) -> tuple[type, ...]:
    """``float`` -> ``(int, float)``, ``int | None`` -> ``(int, NoneType)``, ``Literal['a']`` -> ``(str,)``, …"""
    if typing.get_origin(hint) is Literal:
        return tuple(dict.fromkeys(type(a) for a in typing.get_args(hint)))
    if typing.get_args(hint):  # a union
        return tuple(dict.fromkeys(t for a in typing.get_args(hint) for t in types_of(a)))
    return (int, float) if hint is float else (hint,) if hint in TYPE_NAMES else ()


def describe(types: tuple[type, ...]) -> str:
    """What a value of one of ``types`` is, in words: ``(int, float)`` -> ``'a number'``."""
    return " or ".join(TYPE_NAMES[t] for t in types if not (t is int and float in types))


def is_number(value: object) -> bool:
    """An int or a float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_values(knob: str, kind: str, args: list, current: object) -> None:
    """ConfigError naming the first grid / choice value that is not of the setting's type."""
    types = value_types(knob)
    for value in args:
        if types and not (isinstance(value, types) and (bool in types or not isinstance(value, bool))):
            shown = f"{current:g}" if isinstance(current, float) else json.dumps(current)
            example = "" if current is None else f", e.g. {shown}"
            raise ConfigError(f"space knob {knob!r}: {kind} value {value!r} is not {describe(types)}, which "
                              f"{'.'.join(field_path(knob))} must be{example}; list only such values")


def check_range(knob: str, kind: str, args: list) -> None:
    """ConfigError for bounds that are not two ordered numbers, or a range over a setting that is no real number
    (``epochs``: uniform draws 2.09…, which no trial can run)."""
    log = kind == "loguniform"
    if len(args) != 2 or not all(map(is_number, args)) or not args[0] < args[1] or (log and args[0] <= 0):
        raise ConfigError(f"space knob {knob!r}: {kind} needs [low, high], two numbers with "
                          f"{'0 < ' if log else ''}low < high, got {args!r}")
    types, name = value_types(knob), ".".join(field_path(knob))
    if types and float not in types:
        lo, hi = math.floor(args[0]), math.ceil(args[1])
        whole = list(range(lo, hi + 1)) if hi - lo < 6 else sorted({round(lo + (hi - lo) * i / 3) for i in range(4)})
        over = f", e.g. {json.dumps({knob: {'choice': whole}})}" if int in types else " over its values"
        raise ConfigError(f"space knob {knob!r}: {kind} draws fractions, but {name} must be {describe(types)}; use "
                          f"choice (or grid with --search grid){over}")


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
    dist = space.get(knob) if isinstance(space, dict) else None
    args = next(iter(dist.values()), None) if isinstance(dist, dict) else None
    numbers = [a for a in args if is_number(a)] if isinstance(args, list) else []  # validate_space judges the rest
    return max(numbers, default=default)


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
