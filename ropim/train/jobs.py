"""The one list of training jobs, and ``prepare``: a job's config checked once, before anything heavy starts.

Each ``Job`` names its config class, its Task and register function (imported where they run), what it registers,
its MLflow experiment (the default of its config's ``experiment``), its command (``ropim <name>``) and its
``jobs/<name>.py`` entry for ``ray job submit``. The command line, the ``jobs/`` entries, ``--resume`` and the sweeps
read ``JOBS``; ``ropim.train.driver`` runs what ``prepare`` returns. Imports nothing heavy: ``prepare`` is the
command line's pre-flight, answering bad input before torch, Ray or MLflow is imported.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ropim.errors import ConfigError
from ropim.paths import ray_job_copy, resolve_path
from ropim.tracking.names import default_run_name
from ropim.tracking.preflight import check_models, check_registered_model
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.encoder_job import EncoderJob
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.graft.config import GraftConfig
from ropim.train.job import JobConfig
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig

if TYPE_CHECKING:
    from ropim.tracking.encoders import EncoderRef


@dataclass(frozen=True)
class Job:
    """A training job: the sub-package ``ropim.train.<name>`` of its config (``config.py``), its Task (``task.py``)
    and its register function (``register.py``), and where it shows."""

    config: type[JobConfig]
    task: str  # its Task class in ``ropim.train.<name>.task``, imported where it runs
    # its register function in ``ropim.train.<name>.register``: (config, encoder ref or None, MLflow run id, final
    # checkpoint folder, tracking URI) → the registered URI, or None; the driver calls it unless the config's
    # ``registered_model`` is "" (every job: "" = do not register)
    register: str
    model: str  # what it registers: encoder | classifier | segmenter
    description: str  # ``ropim <name> --help``
    help: str  # its line in ``ropim --help``
    scores: str = ""  # the command's last line once finished: a format of its final metrics, model_uri and run_id
    tag: str = ""  # the run tag holding the registered URI (default ``ropim.<model>_uri``)
    config_artifact: str = ""  # where the run keeps its config (default ``config/<name>.json``)
    # its function in ``register.py`` that logs the final results (same arguments, returns None), registered or not
    results: str = ""

    @property
    def name(self) -> str:
        """Its command, ``jobs/<name>.py``, progress prefix and MLflow tag ``ropim.kind``."""
        return self.config.NAME

    @property
    def experiment(self) -> str:
        """The MLflow experiment of its runs (unless a config names another)."""
        return self.config().experiment

    @property
    def entry(self) -> str:
        """Its ``ray job submit`` entry point, relative to the repository."""
        return f"jobs/{self.name}.py"

    @property
    def model_tag(self) -> str:
        return self.tag or f"ropim.{self.model}_uri"

    @property
    def artifact(self) -> str:
        return self.config_artifact or f"config/{self.name}.json"

    def load(self, what: str):
        """Its Task class (``what`` = "task": from ``task.py``), its register function ("register") or its results
        function ("results"), both from ``register.py``, imported."""
        module = "task" if what == "task" else "register"
        return getattr(importlib.import_module(f"ropim.train.{self.name}.{module}"), getattr(self, what))


REGISTERS = "models:/name/version, models:/name@alias, runs:/…, or a local folder"
JOBS: dict[str, Job] = {job.name: job for job in (
    Job(PretrainConfig, "PretrainTask", "register_encoder", "encoder",
        "Pretrain a ViT with ROPIM on Ray Train; register it.", "pretrain an encoder and register it in MLflow",
        config_artifact="config/pretrain.yaml"),
    Job(FinetuneConfig, "FinetuneTask", "register_classifier", "classifier",
        f"Fine-tune a classifier from an encoder ({REGISTERS}) on Ray Train (num_workers=0: in this process); "
        "register it as ropim-classifier.", "fine-tune from an encoder URI and report top-1 / top-5",
        scores="top-1 {top1:.2f}%  top-5 {top5:.2f}%  classifier {model_uri}  (MLflow run {run_id})",
        results="log_classifier_results"),
    Job(GraftConfig, "GraftTask", "register_graft", "encoder",
        f"LGP-ROPIM's second stage: MoCo v3 on an encoder ({REGISTERS}), its lower blocks at a fraction of the "
        "learning rate (Layer Grafted Pre-training), on Ray Train; register the result as a new encoder version "
        "tagged stage=lgp.", "graft MoCo v3 onto an encoder (LGP-ROPIM) and register it",
        tag="ropim.grafted_encoder_uri"),
    Job(SegmentConfig, "SegmentTask", "register_segmenter", "segmenter",
        "Semantic segmentation transfer: UperNet on an encoder (the paper's ADE20K protocol), on Ray Train "
        "(num_workers=0: in this process); register it as ropim-segmenter.",
        "train UperNet from an encoder URI and report mIoU / pixel accuracy",
        scores="mIoU {miou:.2f}%  pixel accuracy {pixel_acc:.2f}%  segmenter {model_uri}  (MLflow run {run_id})",
        results="log_segment_results"),
)}


def job_of(cfg: JobConfig) -> Job:
    """The job whose config ``cfg`` is."""
    return JOBS[cfg.NAME]


@dataclass(frozen=True)
class Prepared:
    """A job ready to run: its config checked and named, the tracking store that answered; the driver pins the
    encoder (``ref``) it starts from."""

    job: Job
    cfg: JobConfig
    tracking: str
    ref: EncoderRef | None = None

    @property
    def resume_hint(self) -> str:
        """The command that continues this run."""
        cfg = self.cfg
        default = cfg.storage_path == resolve_path("ray_results")
        command = f"ray job submit --working-dir . -- python {self.job.entry}" if ray_job_copy() else \
            f"ropim {self.job.name}"
        return f"{command} --resume {cfg.run_name}" + ("" if default else f" --storage_path {cfg.storage_path}")


def prepare(cfg: JobConfig, tracking: str | None = None, *, register: bool = True) -> Prepared:
    """Check a job's config once, before anything runs: its local paths made absolute, its fields validated (the
    one validation in this process), its workers fitting, the tracking store answering, the encoder it starts from
    there (a local folder's ``config.json`` checked against the job), the training split holding a batch; then name
    the run; last, the stored run of that name and (``register``: the job will register its result) the registered
    model holding no other kind than the job's. Imports no torch and, unless an encoder or a registered model is
    looked up in an existing store, no MLflow. ``tracking``: the MLflow store (default ``tracking_uri()``)."""
    given, cfg = cfg, cfg.resolved().validate()
    cfg.check_resources()
    tracking = tracking or tracking_uri()
    check_tracking(tracking)
    if isinstance(cfg, EncoderJob):  # random init too: the encoder gives the architecture; named as typed
        check_models([given.encoder], "encoder", tracking, cfg.check_encoder)
    cfg.check_data()
    cfg = dataclasses.replace(cfg, run_name=cfg.run_name or default_run_name(cfg.run_prefix))
    job = job_of(cfg)
    check_stored_run(job, cfg)
    if register:
        check_registered_model(cfg.registered_model, job.model, tracking)
    return Prepared(job, cfg, tracking)


def check_stored_run(job: Job, cfg: JobConfig) -> None:
    """A run stored under the same name is one of ``job``'s, and its checkpoints are where this config trains: Ray
    Train workers continue Ray Train's checkpoints, the in-process loop (``num_workers`` 0) its own. ConfigError
    naming the run and the fix otherwise (a finished run is reported, whatever its workers)."""
    from ropim.tracking.lock import check_free
    from ropim.tracking.run_meta import checkpoint_histories, read_run_meta

    meta = read_run_meta(cfg.storage_path, cfg.run_name)
    if meta is None:
        return
    check_free(cfg.storage_path, cfg.run_name)
    where = f"run_name={cfg.run_name!r} under {cfg.storage_path}"
    check_owner(job, meta, where)
    if "checkpoint" in meta:  # finished: reported, not trained
        return
    on_ray, in_process = checkpoint_histories(cfg.storage_path, cfg.run_name)
    if cfg.num_workers == 0 and on_ray and not in_process:
        raise ConfigError(f"num_workers=0: {where} was trained on Ray Train workers, whose checkpoints only Ray Train "
                          "continues; give --num_workers 1 or more (or a new --run_name)")
    if cfg.num_workers > 0 and in_process and not on_ray:
        raise ConfigError(f"num_workers={cfg.num_workers}: {where} was trained in this process (num_workers=0), whose "
                          "checkpoints only the in-process loop continues; give --num_workers 0 (or a new --run_name)")


def resume_config(job: Job, run_name: str, storage_path: str = "ray_results", **resumable) -> JobConfig:
    """The stored config of ``job``'s run ``run_name``, trained to the end, with resumable fields replaced by
    ``resumable``."""
    from ropim.checks import check_location
    from ropim.tracking.run_meta import read_run_meta

    unknown = set(resumable) - set(job.config.RESUMABLE)
    if unknown:
        raise ConfigError(f"--resume: {', '.join(sorted(unknown))} cannot change when continuing a run")
    check_location(storage_path, "storage_path")
    meta = read_run_meta(storage_path, run_name)
    if meta is None:
        raise ConfigError(f"--resume {run_name}: no run of that name under storage_path={storage_path}")
    check_owner(job, meta, f"--resume {run_name}: the run under storage_path={storage_path}")
    return dataclasses.replace(job.config.from_dict(meta["config"]), **{"stop_after_epochs": None, **resumable})


def check_owner(job: Job, meta: dict, where: str) -> None:
    """ConfigError unless the run ``where`` names (its stored ``meta``) is one of ``job``'s."""
    stored = set(meta.get("config", {}))
    if not stored <= {f.name for f in dataclasses.fields(job.config)}:
        owner = next((j.name for j in JOBS.values() if stored <= {f.name for f in dataclasses.fields(j.config)}), "")
        raise ConfigError(f"{where} is {f'a {owner} run' if owner else 'not a run of ropim'}, not a {job.name} "
                          f"run; give this {job.name} another --run_name")


def field_value(cfg: object, name: str) -> object:
    """The value of a dotted field name (``model.rho``) in a config."""
    for part in name.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def resumed(job: Job, run_name: str, given: JobConfig, typed: set[str]) -> tuple[JobConfig, dict]:
    """``--resume run_name``: the run's stored config, every field kept but the resumable ones the command line
    typed (``typed``: dotted field names; their values are in ``given``, storage_path the one the run is under), and
    those changes {field: (stored, typed)}. ConfigError naming each other typed field whose value differs from the
    stored one: what a run computes cannot change halfway."""
    stored = resume_config(job, run_name, given.storage_path)
    now, before = given.resolved(), stored.resolved()
    fixed = sorted(k for k in typed if k.split(".")[0] not in job.config.RESUMABLE
                   and field_value(now, k) != field_value(before, k))
    if fixed:
        changed = ", ".join(f"{k}={field_value(now, k)!r} (stored {field_value(before, k)!r})" for k in fixed)
        raise ConfigError(f"--resume {run_name}: {changed} cannot change when continuing a run (only "
                          f"{', '.join(job.config.RESUMABLE)} may); drop {' '.join('--' + k for k in fixed)} "
                          "(or the --preset / --config that sets it), or start a new run with another --run_name")
    names = {k.split(".")[0] for k in typed} & set(job.config.RESUMABLE)
    changes = {k: (getattr(stored, k), getattr(given, k)) for k in sorted(names)
               if getattr(given, k) != getattr(stored, k)}
    return dataclasses.replace(stored, **{k: new for k, (_, new) in changes.items()}), changes
