"""The MLflow model registry: encoders and classifiers as pickle-free models, their versions, loading them back.

Models are stored as ``<kind>.safetensors`` + ``config.json`` inside a models-from-code pyfunc model
(``mlflow_encoder.py`` / ``mlflow_classifier.py``), so nothing is unpickled on load and a registered model
loads as a plain timm model without ropim installed.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
import numpy as np
from mlflow.models import ModelSignature
from mlflow.types import Schema, TensorSpec
from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

from ropim.paths import recorded_location
from ropim.tracking import store
from ropim.tracking.cards import card, kind_of, stored_lineage
from ropim.tracking.model_folder import MODEL_KINDS, MixedKinds, check_local_model, model_files, wrong_kind
from ropim.tracking.names import CHAMPION, DEFAULT_CLASSIFIER_NAME, DEFAULT_ENCODER_NAME
from ropim.tracking.store import client, flatten, log_pyfunc, logged_model, retrying, run_paths, tracking_uri
from ropim.tracking.uri import ModelRef, check_model_in_store

if TYPE_CHECKING:
    import torch

ENCODER_CODE = Path(__file__).with_name("mlflow_encoder.py")
CLASSIFIER_CODE = Path(__file__).with_name("mlflow_classifier.py")
ENCODER_REQUIREMENTS = store.requirements("torch", "timm", "safetensors", "numpy")  # pinned as installed


def register_model(
    run_id: str,
    state: dict[str, torch.Tensor],
    config: dict,
    name: str,
    uri: str | None = None,
    *,
    kind: str = "encoder",
    code: Path = ENCODER_CODE,
    code_paths: tuple[Path, ...] = (),
    requirements: tuple[str, ...] = tuple(ENCODER_REQUIREMENTS),
) -> str:
    """Log a timm model (``<kind>.safetensors`` + ``config.json``) as a models-from-code pyfunc on ``run_id``,
    register a new version of ``name`` (once: ``run_version``); return its ``models:/name/version`` URI.

    ``config`` must hold ``arch`` and ``timm_kwargs`` (what ``timm.create_model`` needs); its scalar
    entries become version tags (lists and ``timm_kwargs`` stay in the JSON only), with ``kind`` (what the card and
    pre-flight go by). ``code_paths``: Python files shipped with the model (importable by ``code`` when it loads),
    ``requirements``: its pip requirements. The signature holds the input and output shapes; no input example is
    stored (it would be the full-size image, megabytes of JSON, and MLflow would run the model on it to check it).
    ``MixedKinds`` (nothing logged) when ``name`` holds versions of another kind; the ``dataset`` tag is the data
    set as ``ropim.paths.recorded_location`` records it."""
    held = versions(name, uri)
    check_registered_kind(name, kind, held=held)  # again at registration: one may have appeared since the pre-flight
    if (made := run_version(name, run_id, kind, held=held)) is not None:  # stopped (or a reply lost) once made
        describe(name, made, uri)
        return f"models:/{name}/{made}"
    client(uri)  # ``uri`` made the process-wide store that mlflow.pyfunc.log_model and mlflow.register_model use
    model_uri = (logged_model(run_id, kind, uri)  # logged by an attempt stopped before it registered
                 or log_files(run_id, state, config, kind, code, code_paths, requirements))
    tags = {k: str(v) for k, v in flatten(config).items()
            if not k.startswith("timm_kwargs.") and not isinstance(v, (list, tuple))}
    if "dataset" in tags:
        tags["dataset"] = recorded_location(tags["dataset"])

    def once() -> str:  # a retry on a busy store first looks for the version an attempt made before its reply failed
        return run_version(name, run_id, kind, uri) or str(mlflow.register_model(
            model_uri, name, tags={**tags, "kind": kind, "run_id": run_id}).version)

    with registry_lines_muted():  # the version is created with its tags: never seen without them
        version = retrying(once)()
    describe(name, version, uri)
    return f"models:/{name}/{version}"


def log_files(run_id: str, state: dict[str, torch.Tensor], config: dict, kind: str, code: Path,
              code_paths: tuple[Path, ...], requirements: tuple[str, ...]) -> str:
    """Log ``state`` and ``config`` as the pyfunc ``kind`` of run ``run_id`` (``register_model``); its URI."""
    with tempfile.TemporaryDirectory() as tmp:
        from safetensors.torch import save_file  # torch only when a model is written

        weights, cfg_file = Path(tmp) / f"{kind}.safetensors", Path(tmp) / "config.json"
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(weights))
        cfg_file.write_text(json.dumps(config, indent=2, sort_keys=True))
        return retrying(log_pyfunc)(run_id, name=kind, python_model=str(code),
                                    artifacts={"weights": str(weights), "config": str(cfg_file)},
                                    pip_requirements=list(requirements),
                                    code_paths=[str(p) for p in code_paths] or None,
                                    signature=signature(config)).model_uri


def check_registered_kind(name: str, kind: str, uri: str | None = None, *, held: list | None = None) -> None:
    """``MixedKinds`` naming the versions when the registered model ``name`` holds versions whose ``kind`` tag is not
    ``kind``; a model that is not there, has no versions or versions without that tag (the older layout) passes.
    ``held``: its ``versions``, when the caller listed them already."""
    others: dict[str, list[str]] = {}
    for v in versions(name, uri) if held is None else held:
        found = (v.tags or {}).get("kind")
        if found in MODEL_KINDS and found != kind:
            others.setdefault(found, []).append(str(v.version))
    if others:
        raise MixedKinds(name, kind, others)


def versions(name: str, uri: str | None = None) -> list:
    """The registered model ``name``'s versions, oldest first (none when it is not there)."""
    quote = '"' if "'" in name else "'"
    return sorted(client(uri).search_model_versions(f"name={quote}{name}{quote}"), key=lambda v: int(v.version))


def run_version(name: str, run_id: str, kind: str, uri: str | None = None, *, held: list | None = None) -> str | None:
    """The version of ``name`` that run ``run_id`` registered as a ``kind`` (its tags say so), or None: a run
    registers its model once, whatever stopped it between the version and the record of it. ``held``: as for
    ``check_registered_kind``."""
    made = [v for v in (versions(name, uri) if held is None else held)
            if (v.tags or {}).get("run_id") == run_id and v.tags.get("kind") == kind]
    return str(made[0].version) if made else None


@contextlib.contextmanager
def registry_lines_muted() -> Iterator[None]:
    """MLflow prints "Successfully registered model …" and "Created version … of model …" on stderr (not through its
    loggers) whenever a version is registered; ropim prints the version's URI itself. MLflow's own switch for those
    lines is off meanwhile (process-wide: another thread's MLflow messages in that moment are muted too)."""
    was = MLFLOW_LOGGING_STREAM.enabled
    MLFLOW_LOGGING_STREAM.enabled = False
    try:
        yield
    finally:
        MLFLOW_LOGGING_STREAM.enabled = was


def tag_scores(name: str, version: str, scores: dict[str, float | str], uri: str | None = None) -> None:
    """Tag version ``version`` of ``name`` with ``scores`` (``{tag: value}``, e.g. ``downstream.digits.top1``; a
    number as ``%.2f``) and rewrite its card."""
    c = client(uri)
    for k, v in scores.items():
        c.set_model_version_tag(name, version, k, v if isinstance(v, str) else f"{v:.2f}")
    describe(name, version, uri)


def describe(name: str, version: str, uri: str | None = None) -> None:
    """(Re)write the version's model card (``ropim.tracking.cards``) as its MLflow description, from its tags (the
    config's scalars, scores); called when it is registered and when a score is added. Written again while its tags
    change under it: of two jobs scoring one version at once, the one writing last would otherwise leave a card
    without the other's score."""
    c = client(uri)
    mv = c.get_model_version(name, version)
    for _ in range(5):  # each writer of a tag writes the card after it too: this converges
        tags = mv.tags or {}
        c.update_model_version(name, version, description=card(name, version, tags, tags,
                                                                stored_lineage(mv.run_id, tags)))
        mv = c.get_model_version(name, version)
        if (mv.tags or {}) == tags:
            return


def signature(config: dict) -> ModelSignature:
    """The pyfunc's signature: normalized float32 images (B, C, H, W) in, features or logits (B, K) out (a segmenter:
    logits (B, K, H, W))."""
    kwargs = config["timm_kwargs"]
    size, chans = kwargs.get("img_size", config.get("img_size")), kwargs.get("in_chans", 3)
    width = config.get("num_classes") or config.get("embed_dim") or -1
    out = (-1, width, size, size) if config.get("kind") == "segmenter" else (-1, width)
    return ModelSignature(inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, chans, size, size))]),
                          outputs=Schema([TensorSpec(np.dtype(np.float32), out)]))


def register_encoder(run_id: str, encoder_state: dict[str, torch.Tensor], config: dict,
                     name: str = DEFAULT_ENCODER_NAME, uri: str | None = None) -> str:
    """Log the encoder (safetensors + JSON config) on ``run_id``, register a new version; return its URI."""
    return register_model(run_id, encoder_state, config, name, uri)


def register_classifier(run_id: str, state: dict[str, torch.Tensor], config: dict,
                        name: str = DEFAULT_CLASSIFIER_NAME, uri: str | None = None) -> str:
    """Register a fine-tuned timm classifier (``ropim/mlflow_classifier.py``: pyfunc predict gives logits)."""
    return register_model(run_id, state, config, name, uri, kind="classifier", code=CLASSIFIER_CODE)


def resolve_version(model_uri: str, uri: str | None = None) -> tuple[str, str] | None:
    """(name, version) of a ``models:/name/version`` or ``models:/name@alias`` URI, else None."""
    ref = ModelRef.parse(model_uri)
    if ref.scheme != "models":
        return None
    c = client(uri)
    name, alias, version = ref.name, ref.alias, ref.version
    if alias:
        try:
            return name, str(c.get_model_version_by_alias(name, alias).version)
        except mlflow.exceptions.MlflowException as err:
            hint = (f"; a sweep moves {alias!r} to its best encoder of that shape: pretrain and sweep one, or"
                    if alias.startswith(f"{CHAMPION}-") else
                    f"; `ropim sweep` sets {alias!r} on the best encoder it registers, or" if alias == CHAMPION else
                    ";") + f" give --encoder models:/{name}/VERSION (`ropim models list --name {name}` lists them)"
            raise LookupError(f"encoder {model_uri}: no alias {alias!r} on model {name!r} ({err.message}){hint}") \
                from None
    try:
        c.get_model_version(name, version)
    except mlflow.exceptions.MlflowException as err:
        raise LookupError(f"encoder {model_uri}: no such registered version ({err.message})") from None
    return name, version


def check_model_uri(model_uri: str, kind: str = "encoder", uri: str | None = None) -> Path | None:
    """One clear error naming ``model_uri`` when it points at nothing (a wrong name, version, alias, run or folder)
    or at another kind of model (a registered version's ``kind``, a ``runs:/<id>/<kind>`` path); the local folder
    when it is one. Cheap: nothing is downloaded, no torch is imported."""
    local = check_local_model(model_uri, kind)
    if local is not None:
        return local
    check_model_in_store(model_uri, kind, uri or tracking_uri())
    c = client(uri)
    version = resolve_version(model_uri, uri)  # a clear error for a wrong name, version or alias
    found = kind_of(c.get_model_version(*version).tags or {}) if version else kind
    ref = ModelRef.parse(model_uri)
    if ref.run_id:
        try:
            run = c.get_run(ref.run_id)
        except mlflow.exceptions.MlflowException:
            raise LookupError(f"{kind} {model_uri}: no MLflow run {ref.run_id!r} at {uri or tracking_uri()}") from None
        logged_as = ref.path.split("/")[0]  # register_model logs each model under its kind
        held = run_paths(run, uri)
        if logged_as not in held:
            raise LookupError(f"{kind} {model_uri}: run {ref.run_id} holds no artifact {logged_as!r} (it holds "
                              f"{', '.join(held) or 'none'}); give runs:/{ref.run_id}/<one of them>")
        found = logged_as if logged_as in MODEL_KINDS else kind
    if found != kind:
        raise wrong_kind(model_uri, kind, found)
    return None


@contextlib.contextmanager
def local_copy(model_uri: str, kind: str, uri: str | None) -> Iterator[Path]:
    """A local folder holding the model at ``model_uri`` while the block runs: a download goes into a temporary folder
    removed after it (each worker of each job that reads a registered ViT-B left ~350 MB in the temp folder); one
    clear error naming the URI when there is none."""
    local = check_model_uri(model_uri, kind, uri)
    if local is not None:
        yield local
        return
    with tempfile.TemporaryDirectory(prefix="ropim-model-") as tmp:
        try:
            folder = Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=tmp))
        except (mlflow.exceptions.MlflowException, OSError) as err:
            msg = getattr(err, "message", str(err)).splitlines()[0]
            raise FileNotFoundError(f"{kind} {model_uri}: cannot download it ({msg})") from None
        yield folder


def load_model_files(model_uri: str, uri: str | None = None, kind: str = "encoder") -> tuple[dict[str, torch.Tensor],
                                                                                          dict]:
    """(state dict, config) of a ``kind`` ('encoder' / 'classifier') at a ``models:/…``, ``runs:/…`` URI or a
    local folder holding ``<kind>.safetensors`` + ``config.json``."""
    from safetensors.torch import load_file  # torch only when a model is read

    with local_copy(model_uri, kind, uri) as folder:
        weights, cfg_file = model_files(folder, kind, model_uri)
        return load_file(str(weights)), json.loads(cfg_file.read_text())


def load_encoder_files(model_uri: str, uri: str | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, config) of an encoder at a ``models:/…``, ``runs:/…`` URI or local model folder."""
    return load_model_files(model_uri, uri, "encoder")


def load_classifier(model_uri: str, uri: str | None = None):
    """A registered ``ropim-classifier`` as a plain timm model (VisionTransformer or Beit, eval mode) and its config."""
    import timm

    from ropim.core.backbone import load_weights

    state, config = load_model_files(model_uri, uri, "classifier")
    model = timm.create_model(config["arch"], pretrained=False, **config["timm_kwargs"])
    load_weights(model, state, f"classifier {model_uri}")
    return model.eval(), config


def load_encoder(model_uri: str, uri: str | None = None, **timm_overrides):
    """The registered encoder as a plain timm model (VisionTransformer or Beit, eval mode) and its config;
    ``timm_overrides`` change its timm arguments, not its weights (another ``img_size``: ``build_classifier``)."""
    import timm

    from ropim.core.backbone import load_weights

    state, config = load_encoder_files(model_uri, uri)
    model = timm.create_model(config["arch"], pretrained=False, **{**config["timm_kwargs"], **timm_overrides})
    given = f"load_encoder with {timm_overrides} (ropim.core.backbone.build_classifier resamples for another " \
        "img_size): " * bool(timm_overrides)
    load_weights(model, state, f"{given}encoder {model_uri}", optional=("head.",))
    return model.eval(), config
