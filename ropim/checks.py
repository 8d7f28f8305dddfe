"""Checks of config fields: one ``ConfigError`` naming the field, its value and what it must be.

A field's rule is a ``Range`` or a ``OneOf``; a field declared ``bool`` must hold true or false. Every number is
checked for type and finiteness too, so ``nan``, ``inf`` and negative values of fields that must be positive are
refused before any work starts (``--base_lr nan`` passes ``base_lr <= 0`` otherwise).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ropim.errors import ConfigError
from ropim.paths import is_uri

RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Range:
    """A closed or half-open interval a number must lie in; ``optional``: None is allowed too."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    optional: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.high == math.inf:
            bound = f"{'>' if self.low_open else '≥'} {self.low:g}"
        elif self.low == -math.inf:
            bound = f"{'<' if self.high_open else '≤'} {self.high:g}"
        else:
            bound = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        return f"{kind} {bound}" + (" (or null)" if self.optional else "")

    def holds(self, value) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.integer and not float(value).is_integer():
            return False
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below


@dataclass(frozen=True)
class OneOf:
    """A value from a fixed set of choices."""

    choices: tuple

    def describe(self) -> str:
        return f"one of {', '.join(map(str, self.choices))}"

    def holds(self, value) -> bool:
        return not isinstance(value, bool) and value in self.choices


@dataclass(frozen=True)
class Flag:
    """True or false."""

    def describe(self) -> str:
        return "true or false"

    def holds(self, value) -> bool:
        return isinstance(value, bool)


Rule = Range | OneOf | Flag
FLAG = Flag()


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
SHARE = Range(0, 1)  # a probability or a share
COUNT = Range(1, integer=True)  # at least one
SEED = Range(0, 2**31 - 1, integer=True)


@functools.cache
def declared_rules(cls: type) -> dict[str, Rule]:
    """The rules the dataclass ``cls`` declares by its fields' types: a ``bool`` is true or false, a ``Literal`` one
    of its values."""
    hints = typing.get_type_hints(cls)
    return {f.name: FLAG if hints[f.name] is bool else OneOf(typing.get_args(hints[f.name]))
            for f in dataclasses.fields(cls) if hints[f.name] is bool or typing.get_origin(hints[f.name]) is Literal}


def check_value(name: str, value: object, rule: Rule) -> None:
    """Raise ConfigError naming ``name``, ``value`` and what it must be, unless ``value`` holds ``rule``."""
    if not rule.holds(value):
        raise ConfigError(f"{name}={value!r}: must be {rule.describe()}")


def check_fields(cfg: object, rules: dict[str, Rule], prefix: str = "") -> None:
    """Raise ConfigError for the first field of the dataclass ``cfg`` outside its rule: those of ``rules``, after those
    its field types declare (``declared_rules``)."""
    for name, rule in {**declared_rules(type(cfg)), **rules}.items():
        check_value(prefix + name, getattr(cfg, name), rule)


def check_run_name(name: str | None, field: str = "run_name") -> None:
    """A run name is one path-safe folder name: letters, digits, '.', '_', '-' (no '/', no '..', not absolute)."""
    if name is None:
        return
    if not RUN_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"{field}={name!r}: use letters, digits, '.', '_' and '-' only (no '/', '..' or "
                          "absolute paths), at most 128 characters, e.g. my-run-1")


def check_mlflow_names(experiment: str, registered_model: str = "") -> None:
    """MLflow's rules, checked before it is imported: an experiment name is not empty and at most 500 characters; a
    registered model's name ("" = none) holds no '/' or ':' and does not start with '.' (MLflow may store it as
    a file name)."""
    if not isinstance(experiment, str) or not experiment.strip() or len(experiment) > 500:
        raise ConfigError(f"experiment={experiment!r}: give the MLflow experiment a name of 1-500 characters, e.g. "
                          "ropim-pretrain")
    model = registered_model or "x"
    if not isinstance(model, str) or "/" in model or ":" in model or model.startswith(".") or not model.strip():
        raise ConfigError(f"registered_model={registered_model!r}: MLflow model names hold no '/' or ':' and do not "
                          "start with '.'; use letters, digits, '-', '_' (e.g. ropim-encoder), or \"\" to register "
                          "nothing")


CREDENTIAL_QUERY = re.compile(r"key|secret|token|password|credential|signature", re.IGNORECASE)


def check_location(location: str | None, field: str) -> None:
    """A storage or data URI may not carry credentials (``s3://KEY:SECRET@bucket/…``, ``?secret_key=…``): they would
    be logged with the run's config (MLflow params) and printed. ConfigError pointing to the environment variables,
    showing the URI without them."""
    if not isinstance(location, str) or not is_uri(location):
        return
    from urllib.parse import parse_qsl, urlsplit

    parts = urlsplit(location)
    secret_query = any(CREDENTIAL_QUERY.search(k) for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    if parts.query and field.endswith("storage_path"):  # run, checkpoint and lock paths are joined onto it
        raise ConfigError(f"{field}={parts.scheme}://{parts.netloc}{parts.path}?{parts.query}: a storage URI may not "
                          "carry query parameters (the runs' folders are joined onto its path); give the endpoint and "
                          f"region as AWS_ENDPOINT_URL / AWS_REGION, and {field}={parts.scheme}://{parts.netloc}"
                          f"{parts.path}")
    if "@" in parts.netloc or secret_query:
        shown = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"
        raise ConfigError(f"{field}={shown} (credentials removed): a URI may not carry credentials, they would be "
                          "logged with the run's config; give them as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and "
                          "AWS_SESSION_TOKEN) environment variables, AWS_PROFILE, or the node's instance role")


def check_folder(path: str, what: str) -> None:
    """``path`` (the input ``what`` names) is a local folder that can be written to, or one that can be created
    (nothing is created here); ConfigError naming it otherwise, before any work whose results it would hold."""
    if is_uri(path):  # Path would make s3://b/out the local folder ./s3:/b/out
        raise ConfigError(f"{what} {path!r}: a local folder is written here, not a URI; give a folder (and copy it to "
                          "storage afterwards)")
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{what} {path!r} is a file, not a folder; give a folder, or move the file")
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {path!r} cannot be created: {parent} is a file; give a folder path")
    if not os.access(parent, os.W_OK | os.X_OK):
        where = "folder is" if parent == p else f"folder cannot be created in {parent}:"
        raise ConfigError(f"{what} {path!r}: the {where} not writable; give a folder you can write to")


def visible_gpus() -> int:
    """GPUs this machine exposes (NVIDIA device files), without importing torch."""
    import glob

    return len(glob.glob("/dev/nvidia[0-9]*"))


def check_local_resources(num_workers: int, cpus_per_worker: float, use_gpu: bool, wait: bool) -> None:
    """On a local Ray (no RAY_ADDRESS, no Ray up in this process: ``local_cpus``), workers must fit this machine:
    ConfigError for a GPU run without a GPU or for more worker CPUs than the machine has, unless ``wait``
    (``wait_for_resources``) says to wait for them. A sweep trial's driver, on whatever node Ray placed it, is in a Ray
    already: the cluster is judged there, not that node."""
    cpus = local_cpus()
    if wait or cpus is None:
        return
    if use_gpu and not visible_gpus():
        raise ConfigError("use_gpu=true but this machine has no visible GPU; drop --use_gpu, run on a GPU "
                          "cluster (RAY_ADDRESS), or set --wait_for_resources true to wait for one")
    if num_workers * cpus_per_worker > cpus:
        raise ConfigError(f"num_workers={num_workers} × cpus_per_worker={cpus_per_worker:g} needs "
                          f"{num_workers * cpus_per_worker:g} CPUs, this machine has {cpus}; lower them, or set "
                          "--wait_for_resources true to wait for a cluster to grow")


def waiting_note(num_workers: int, cpus_per_worker: float, use_gpu: bool, cpus: float, gpus: float,
                 cluster: str) -> str | None:
    """One line when the workers (a GPU each with ``use_gpu``) do not fit the ``cpus`` / ``gpus`` of the joined
    ``cluster`` as it is now: Ray Train waits for nodes without a word (an autoscaler adds them; a fixed cluster
    never does)."""
    short = [f"{need:g} {what} ({have:g} now)" for need, have, what in
             ((num_workers * cpus_per_worker, cpus, "CPUs"), (num_workers if use_gpu else 0, gpus, "GPUs"))
             if need > have]
    if not short:
        return None
    return (f"{num_workers} workers need {' and '.join(short)} of {cluster}: waiting for nodes to join (an autoscaler "
            "adds them); on a cluster that does not grow, stop (Ctrl+C) and lower --num_workers or --cpus_per_worker")


def local_cpus() -> int | None:
    """The CPUs of the Ray cluster ``ray.init()`` will start on this machine, or None when the job joins one instead
    (RAY_ADDRESS, or a Ray already up in this process): known before Ray starts, as ``check_local_resources`` uses
    them."""
    import os
    import sys

    ray = sys.modules.get("ray")
    if os.environ.get("RAY_ADDRESS") or (ray is not None and ray.is_initialized()):
        return None
    return os.cpu_count() or 1


DATA_CPUS = 1.0  # logical CPUs Ray Data needs beside the Train workers: its read tasks ask for 1 each (Ray's default)


def data_cpu_share(cpus: float, num_workers: int) -> float:
    """The largest CPU share per Train worker (in hundredths) that leaves Ray Data ``DATA_CPUS`` of ``cpus`` logical
    CPUs: what ``check_data_cpus`` names as the fix, and the most to give ``ScalingConfig(resources_per_worker={"CPU":
    share})`` when calling the library yourself (2 workers on 2 CPUs: 0.5; on 8 CPUs: 3.5, where less leaves Ray Data
    more decode tasks). 0 when nothing is left for the workers."""
    return max(0.0, math.floor(100 * (cpus - DATA_CPUS) / num_workers) / 100)


def check_data_cpus(cpus: float, num_workers: int, cpus_per_worker: float, cluster: str, trials: int = 1) -> None:
    """``ingest=ray_data``: the Train workers of ``trials`` concurrent runs (a sweep's ``--max-concurrent``), which Ray
    places first, must leave Ray Data ``DATA_CPUS`` of the ``cpus`` logical CPUs of ``cluster``; else its read tasks
    never start and no run reads a row until Ray's 30-minute no-progress timeout. Workers that do not all fit
    ``cpus`` wait for nodes and are judged as those join. ConfigError naming the fixes (a CPU share per worker,
    fewer workers or trials, torch ingest)."""
    held = trials * num_workers * cpus_per_worker
    if held > cpus or cpus - held >= DATA_CPUS:
        return
    fixes = []
    if (share := data_cpu_share(cpus, trials * num_workers)) > 0:
        fixes.append(f"--cpus_per_worker {share:g}")
    fewer = math.floor((cpus - DATA_CPUS) / (cpus_per_worker * (num_workers if trials > 1 else 1)))
    if 1 <= fewer < (trials if trials > 1 else num_workers):
        fixes.append(f"--max-concurrent {fewer}" if trials > 1 else f"--num_workers {fewer}")
    runs, who = (f"max_concurrent={trials} trials × ", "every trial") if trials > 1 else ("", "the job")
    raise ConfigError(f"ingest=ray_data: {runs}num_workers={num_workers} × cpus_per_worker={cpus_per_worker:g} hold "
                      f"{held:g} of the {cpus:g} CPUs of {cluster}, leaving Ray Data's read and decode tasks "
                      f"{cpus - held:g} (they need {DATA_CPUS:g}): {who} would read no data until Ray's 30-minute "
                      f"timeout; use {', '.join(fixes)}{' or ' if fixes else ''}--ingest torch")


def check_encoder_input(uri: str, config: dict, img_size: int | None = None) -> None:
    """An encoder (its ``config.json``) fits the images a job gives it: RGB, as every data source decodes them, and
    ``img_size`` (None: its own) a multiple of its patch size. One error naming the encoder and the fix."""
    missing = [k for k in ("arch", "img_size", "patch_size") if not isinstance(config, dict) or k not in config]
    if missing:
        raise ConfigError(f"encoder {uri}: its config.json lacks {', '.join(missing)}; it is not an encoder's config "
                          "(copy or export the encoder again, with the config.json it was saved with)")
    chans = config.get("in_chans", config.get("timm_kwargs", {}).get("in_chans", 3))
    if chans != 3:
        raise ConfigError(f"encoder {uri} expects {chans}-channel images (in_chans={chans}), and every data source "
                          "gives 3-channel (RGB) images; use an encoder pretrained on RGB data")
    size, p = img_size or config["img_size"], config["patch_size"]
    if size <= 0 or size % p:
        raise ConfigError(f"img_size={size}: encoder {uri} has patch size {p}, which must divide the image size "
                          f"(e.g. img_size={max(p, size - size % p)})")


def check_knn_bank(k: int, bank: int, what: str, field: str = "knn_k") -> None:
    """A kNN's k is at most the ``bank`` of train features it searches (``what`` says which): a larger k would be
    capped to the bank, and the protocol it is reported under (``k=…``) would be false."""
    if k > bank:
        raise ConfigError(f"{field}={k} is more than the {bank} images of the kNN's bank ({what}): give {field}={bank} "
                          "or less")
