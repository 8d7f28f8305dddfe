"""MLflow: tracking store, runs, encoder artifacts, registered versions and loading them back.

Local default: ``sqlite:///<cwd>/mlflow.db`` with artifacts in ``<cwd>/mlartifacts``;
``MLFLOW_TRACKING_URI`` overrides (e.g. the cluster's ``mlflow server``).
Encoders are stored as ``encoder.safetensors`` + ``config.json`` inside a models-from-code pyfunc
model (``ropim/mlflow_encoder.py``), so nothing is unpickled on load.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import mlflow
import torch
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file, save_file

from ropim.errors import ConfigError

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

DEFAULT_ENCODER_NAME = "ropim-encoder"
DEFAULT_CLASSIFIER_NAME = "ropim-classifier"
ENCODER_CODE = Path(__file__).with_name("mlflow_encoder.py")
CLASSIFIER_CODE = Path(__file__).with_name("mlflow_classifier.py")
ENCODER_REQUIREMENTS = ["torch", "timm", "safetensors", "numpy"]


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else the sqlite store in the working directory (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def check_tracking(uri: str, timeout: float = 5.0) -> None:
    """Fail fast, naming the URI and the fix, when the tracking store cannot be reached."""
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).read()
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(
                f"MLFLOW_TRACKING_URI={uri}: MLflow server unreachable ({err}). Start it (`make cluster-up`) "
                "or unset MLFLOW_TRACKING_URI to use the local sqlite store."
            ) from None
    elif uri.startswith("sqlite:///"):
        folder = Path(uri.removeprefix("sqlite:///")).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise ConnectionError(f"MLFLOW_TRACKING_URI={uri}: folder {folder} is missing or not writable.")


def client(uri: str | None = None) -> MlflowClient:
    """A client on ``uri`` (default: ``tracking_uri()``); also makes it the process-wide URI."""
    uri = uri or tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def ensure_experiment(name: str, uri: str | None = None) -> str:
    """The id of experiment ``name``, created (artifacts beside a local sqlite store) when missing."""
    uri = uri or tracking_uri()
    c = client(uri)
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return c.create_experiment(name, artifact_location=location)


def flatten(d: dict, prefix: str = "") -> dict[str, object]:
    """{'model': {'rho': 0.14}} -> {'model.rho': 0.14}."""
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def create_run(experiment: str, run_name: str | None, params: dict, tags: dict | None = None,
               uri: str | None = None) -> str:
    """Start a run (left RUNNING), log ``params`` flattened and ``tags``; return its id."""
    uri = uri or tracking_uri()
    c = client(uri)
    run = c.create_run(ensure_experiment(experiment, uri), run_name=run_name, tags=tags or {})
    c.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in flatten(params).items()])
    return run.info.run_id


def log_metrics(run_id: str, metrics: dict[str, float], step: int, uri: str | None = None) -> None:
    """Log a dict of metrics at ``step``."""
    now = int(time.time() * 1000)
    client(uri).log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def set_tags(run_id: str, tags: dict[str, object], uri: str | None = None) -> None:
    """Set run tags."""
    client(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_text(run_id: str, text: str, artifact_file: str, uri: str | None = None) -> None:
    """Store ``text`` as a run artifact."""
    client(uri).log_text(run_id, text, artifact_file)


def log_artifact(run_id: str, local_path: str | Path, artifact_path: str | None = None,
                 uri: str | None = None) -> None:
    """Upload a local file as a run artifact (under ``artifact_path``)."""
    client(uri).log_artifact(run_id, str(local_path), artifact_path)


def end_run(run_id: str, status: str = "FINISHED", uri: str | None = None) -> None:
    """Mark the run FINISHED / FAILED / KILLED."""
    client(uri).set_terminated(run_id, status)


def register_model(
    run_id: str,
    state: dict[str, torch.Tensor],
    config: dict,
    name: str,
    uri: str | None = None,
    *,
    kind: str = "encoder",
    code: Path = ENCODER_CODE,
) -> str:
    """Log a timm model (``<kind>.safetensors`` + ``config.json``) as a models-from-code pyfunc on ``run_id``,
    register a new version of ``name``; return its ``models:/name/version`` URI.

    ``config`` must hold ``arch`` and ``timm_kwargs`` (what ``timm.create_model`` needs); its scalar
    entries become version tags (lists and ``timm_kwargs`` stay in the JSON only).
    """
    c = client(uri)
    with tempfile.TemporaryDirectory() as tmp:
        weights, cfg_file = Path(tmp) / f"{kind}.safetensors", Path(tmp) / "config.json"
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(weights))
        cfg_file.write_text(json.dumps(config, indent=2, sort_keys=True))
        with mlflow.start_run(run_id=run_id, nested=mlflow.active_run() is not None), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Add type hints to the `predict` method")
            info = mlflow.pyfunc.log_model(
                name=kind,
                python_model=str(code),
                artifacts={"weights": str(weights), "config": str(cfg_file)},
                pip_requirements=ENCODER_REQUIREMENTS,
                registered_model_name=name,
            )
    version = str(info.registered_model_version)
    for k, v in flatten(config).items():
        if k.startswith("timm_kwargs.") or isinstance(v, (list, tuple)):
            continue
        c.set_model_version_tag(name, version, k, str(v))
    c.set_model_version_tag(name, version, "run_id", run_id)
    return f"models:/{name}/{version}"


def register_encoder(
    run_id: str,
    encoder_state: dict[str, torch.Tensor],
    config: dict,
    name: str = DEFAULT_ENCODER_NAME,
    uri: str | None = None,
) -> str:
    """Log the encoder (safetensors + JSON config) on ``run_id``, register a new version; return its URI.

    ``config`` must hold ``arch`` and ``timm_kwargs`` (what ``timm.create_model`` needs); its scalar
    entries become version tags.
    """
    return register_model(run_id, encoder_state, config, name, uri)


def register_classifier(
    run_id: str,
    state: dict[str, torch.Tensor],
    config: dict,
    name: str = DEFAULT_CLASSIFIER_NAME,
    uri: str | None = None,
) -> str:
    """Register a fine-tuned timm classifier (``ropim/mlflow_classifier.py``: pyfunc predict gives logits)."""
    return register_model(run_id, state, config, name, uri, kind="classifier", code=CLASSIFIER_CODE)


def resolve_version(model_uri: str, uri: str | None = None) -> tuple[str, str] | None:
    """(name, version) of a ``models:/name/version`` or ``models:/name@alias`` URI, else None."""
    if not model_uri.startswith("models:/"):
        return None
    ref = model_uri.removeprefix("models:/").rstrip("/")
    c = client(uri)
    if "@" in ref:
        name, alias = ref.split("@", 1)
        try:
            return name, str(c.get_model_version_by_alias(name, alias).version)
        except mlflow.exceptions.MlflowException as err:
            raise LookupError(f"encoder {model_uri}: no alias {alias!r} on model {name!r} ({err.message})") from None
    name, _, version = ref.partition("/")
    try:
        c.get_model_version(name, version)
    except mlflow.exceptions.MlflowException as err:
        raise LookupError(f"encoder {model_uri}: no such registered version ({err.message})") from None
    return name, version


def _local_copy(model_uri: str, kind: str, uri: str | None) -> Path:
    """A local folder holding the model at ``model_uri``; one clear error naming the URI when there is none."""
    local = Path(model_uri).expanduser()
    if local.exists():
        return local
    if not model_uri.startswith(("models:/", "runs:/")) and "://" not in model_uri:
        raise FileNotFoundError(
            f"{kind} {model_uri}: no such local folder; give a folder holding {kind}.safetensors + config.json, "
            "models:/name/version, models:/name@alias or runs:/<run_id>/<artifact path>"
        )
    c = client(uri)
    resolve_version(model_uri, uri)  # a clear error for a wrong name, version or alias
    if model_uri.startswith("runs:/"):
        run_id = model_uri.removeprefix("runs:/").split("/", 1)[0]
        try:
            c.get_run(run_id)
        except mlflow.exceptions.MlflowException:
            raise LookupError(f"{kind} {model_uri}: no MLflow run {run_id!r} at {uri or tracking_uri()}") from None
    try:
        return Path(mlflow.artifacts.download_artifacts(model_uri))
    except (mlflow.exceptions.MlflowException, OSError) as err:
        msg = getattr(err, "message", str(err)).splitlines()[0]
        raise FileNotFoundError(f"{kind} {model_uri}: cannot download it ({msg})") from None


def load_model_files(model_uri: str, uri: str | None = None, kind: str = "encoder") -> tuple[dict[str, torch.Tensor],
                                                                                          dict]:
    """(state dict, config) of a ``kind`` ('encoder' / 'classifier') at a ``models:/…``, ``runs:/…`` URI or a
    local folder holding ``<kind>.safetensors`` + ``config.json``."""
    client(uri)
    local = _local_copy(model_uri, kind, uri)
    weights = next(local.rglob(f"{kind}.safetensors"), None)
    cfg_file = next(local.rglob("config.json"), None)
    if weights is None or cfg_file is None:
        raise FileNotFoundError(f"{kind} {model_uri}: no {kind}.safetensors + config.json found in {local}")
    return load_file(str(weights)), json.loads(cfg_file.read_text())


def load_encoder_files(model_uri: str, uri: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, config) of an encoder at a ``models:/…``, ``runs:/…`` URI or local model folder."""
    return load_model_files(model_uri, uri, "encoder")


def load_classifier(model_uri: str, uri: str | None = None):
    """A registered ``ropim-classifier`` as a plain timm VisionTransformer (eval mode) and its config."""
    import timm

    state, config = load_model_files(model_uri, uri, "classifier")
    model = timm.create_model(config["arch"], pretrained=False, **config["timm_kwargs"])
    model.load_state_dict(state)
    return model.eval(), config


def load_encoder(model_uri: str, uri: str | None = None, **timm_overrides):
    """The registered encoder as a plain timm VisionTransformer (eval mode) and its config."""
    import timm

    state, config = load_encoder_files(model_uri, uri)
    model = timm.create_model(config["arch"], pretrained=False, **{**config["timm_kwargs"], **timm_overrides})
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("head.") for k in missing):
        raise ConfigError(f"encoder {model_uri}: weights do not match {config['arch']} ({missing=}, {unexpected=})")
    return model.eval(), config


CHAMPION = "champion"


def dataset_alias(dataset: str, alias: str = CHAMPION) -> str:
    """The per-dataset alias, e.g. ``champion-digits``; paths use their last part plus a short hash."""
    import hashlib
    import re

    if re.fullmatch(r"[A-Za-z0-9_]+", dataset):
        return f"{alias}-{dataset}"
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", dataset.rstrip("/").split("?")[0].rsplit("/", 1)[-1]).strip("_")
    return f"{alias}-{stem or 'data'}-{hashlib.sha1(dataset.encode()).hexdigest()[:6]}"


def _challenge(c: MlflowClient, name: str, version: str, alias: str, metric: str, dataset: str, value: float,
               higher_is_better: bool) -> tuple[bool, str]:
    """Whether ``version`` (``metric`` = ``value`` on ``dataset``) takes ``alias``, and why (one line)."""
    try:
        holder = c.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException:
        return True, f"no version held {alias!r}"
    if str(holder.version) == str(version):
        return False, f"v{version} already holds {alias!r}"
    tags = holder.tags or {}
    if tags.get("metric") is None or tags.get("metric_dataset") is None or tags.get("metric_value") is None:
        return False, f"{alias!r} is v{holder.version}, which has no metric/dataset tags to compare against"
    if tags["metric_dataset"] != dataset:
        return False, f"{alias!r} is v{holder.version} on another dataset ({tags['metric_dataset']})"
    if tags["metric"] != metric:
        return False, f"{alias!r} is v{holder.version} scored by another metric ({tags['metric']})"
    current = float(tags["metric_value"])
    better = value > current if higher_is_better else value < current
    verdict = "beats" if better else "does not beat"
    return better, f"{metric} {value:.4g} {verdict} v{holder.version}'s {current:.4g} on {dataset}"


def promote_champion(name: str, version: str, metric: str, dataset: str, value: float,
                     higher_is_better: bool = True, uri: str | None = None,
                     alias: str = CHAMPION) -> dict[str, tuple[bool, str]]:
    """Tag version ``version`` with its score and move the aliases it wins; return {alias: (moved, reason)}.

    The version gets tags ``metric``, ``metric_dataset``, ``metric_value``. Two aliases are challenged:
    ``alias`` (``champion``, what fine-tuning loads by default) and the per-dataset ``dataset_alias(dataset)``.
    Each moves only when nobody holds it or the holder was scored on the same metric and dataset and the new
    value is strictly better; a holder from another dataset or metric (or without score tags) keeps it.
    Each decision is stored as a version tag ``alias.<alias>``.
    """
    c = client(uri)
    version = str(version)
    for k, v in {"metric": metric, "metric_dataset": dataset, "metric_value": repr(float(value))}.items():
        c.set_model_version_tag(name, version, k, v)
    decisions = {}
    for a in (alias, dataset_alias(dataset, alias)):
        moved, reason = _challenge(c, name, version, a, metric, dataset, float(value), higher_is_better)
        if moved:
            c.set_registered_model_alias(name, a, version)
        decisions[a] = (moved, reason)
        c.set_model_version_tag(name, version, f"alias.{a}", ("moved here: " if moved else "not moved: ") + reason)
    return decisions
