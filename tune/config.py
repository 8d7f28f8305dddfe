"""What a sweep is (``SweepConfig``): the search, its space, the scheduler, the metric, and the pretraining run
every trial starts from. Imports nothing heavy, so the command line parses and validates fast.

Shipped presets are ordinary config files in ``tune/presets/`` (``rho_ablation``, ``tpe``): sweep fields plus the
pretraining preset they start from and a few pretraining overrides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ropim.checks import (
    COUNT,
    SEED,
    OneOf,
    Range,
    check_data_cpus,
    check_fields,
    check_location,
    check_mlflow_names,
    check_run_name,
)
from ropim.errors import ConfigError
from ropim.paths import recorded_location, resolve_path
from tune.spaces import max_value, n_grid_points, validate_space

if TYPE_CHECKING:
    from ropim.train.pretrain.config import PretrainConfig

PRESETS = Path(__file__).with_name("presets")
SEARCHES = ("grid", "tpe")
SCHEDULERS = ("none", "asha")
# metric -> mode. knn_top1 / linear_top1: reported by rank 0 on eval epochs (PretrainConfig.eval_every; linear_top1
# turns on eval_linear_probe). finetune_top1 (the paper's ablation protocol): after its last epoch each trial
# fine-tunes its encoder (``finetune``: the recipe and budget) on the train split and reports val top-1.
# segment_miou (the paper's Table 3 transfer): after its last epoch each trial trains UperNet on its encoder
# (``segment``: the recipe, budget and segmentation data) and reports val mIoU.
METRICS = {"knn_top1": "max", "linear_top1": "max", "finetune_top1": "max", "segment_miou": "max"}
ONCE = ("finetune_top1", "segment_miou")  # measured once, after a trial's last epoch
# where a trial's fine-tune or segmentation runs: the trial's own workers
TRIAL_RESOURCES = ("num_workers", "use_gpu", "cpus_per_worker", "wait_for_resources")
# a downstream job's fields that do not change its score (beside its resumable ones): not in a score's protocol
NOT_RECIPE = ("seed", "run_name", "experiment", "storage_path", "registered_model", "encoder", "random_init",
              "checkpoint_every", "keep_checkpoints", "max_failures", "eval_every", *TRIAL_RESOURCES)
# FinetuneConfig fields a trial's fine-tune takes from the trial itself, not from the sweep's ``finetune``
FINETUNE_FROM_TRIAL = ("encoder", "random_init", "data", "seed", "experiment", "run_name", "storage_path",
                       "registered_model", *TRIAL_RESOURCES)


@dataclass(frozen=True)
class SweepConfig:
    """One sweep: how trials are chosen, how many run at once, and the pretraining run each trial is."""

    preset: str = "rho_ablation"
    """the preset the sweep started from: the default name of the sweep and a tag of its MLflow run"""
    search: str = "grid"
    """grid (every point of the space) or tpe (Optuna)"""
    space: dict = field(default_factory=dict)
    """knob → {KIND: [values]}, KIND grid, choice, uniform or loguniform (a knob is a pretraining field: rho,
    base_lr, epochs, …)"""
    metric: str = "knn_top1"
    """what a trial scores: knn_top1, linear_top1, finetune_top1 or segment_miou"""
    scheduler: str = "none"
    """none, or asha (stops weak trials early)"""
    grace_period: int = 1
    """ASHA: epochs before a trial can be stopped"""
    reduction_factor: int = 2
    """ASHA"""
    num_samples: int = 1
    """TPE: trials; grid: seeds per grid point (seed, seed+1, …)"""
    max_concurrent: int | None = None
    """None: as many as the cluster's CPUs (GPUs) fit"""
    search_seed: int = 0
    """TPE sampler seed"""
    startup_trials: int | None = None
    """TPE: trials drawn at random before TPE models the scores (Optuna's n_startup_trials); None: half of
    num_samples, at most Optuna's 10 (with its 10, a sweep of 10 trials or fewer would be a random search)"""
    name: str | None = None
    """the sweep's folder under storage_path and its MLflow parent run name"""
    storage_path: str = "ray_results"
    """where the sweep's trials keep their checkpoints: a folder or a URI"""
    experiment: str = "ropim-sweep"
    """the MLflow experiment of the sweep's parent run"""
    register: bool = True
    """register the best trial's encoder and apply the champion rule (not when the pretraining's registered_model is
    "", as for every job)"""
    pretrain: dict = field(default_factory=dict)
    """PretrainConfig.to_dict() every trial starts from"""
    finetune: dict = field(default_factory=dict)
    """metric finetune_top1: FinetuneConfig fields of every trial's fine-tune (those of FINETUNE_FROM_TRIAL come
    from the trial)"""
    segment: dict = field(default_factory=dict)
    """metric segment_miou: SegmentConfig fields of every trial's segmentation (its own data; workers, seed and the
    encoder come from the trial)"""

    @property
    def resume_command(self) -> str:
        """The command that continues this sweep."""
        return f"ropim sweep --resume {self.name} --storage-path {self.storage_path}"

    @property
    def mode(self) -> str:
        return METRICS[self.metric]

    @property
    def n_trials(self) -> int:
        """Trials the finished sweep holds."""
        return self.num_samples * (n_grid_points(self.space) if self.search == "grid" else 1)

    @property
    def n_startup(self) -> int:
        """TPE: the trials drawn at random before TPE models the scores."""
        return self.startup_trials if self.startup_trials is not None else max(1, min(10, self.num_samples // 2))

    @property
    def max_epochs(self) -> int:
        return int(max_value(self.space, "epochs", self.pretrain["epochs"]))

    def validate(self) -> SweepConfig:
        """Raise ConfigError naming the bad field and its fix, before Ray starts."""
        check_fields(self, {"search": OneOf(SEARCHES), "scheduler": OneOf(SCHEDULERS), "metric": OneOf(tuple(METRICS)),
                            "num_samples": COUNT, "max_concurrent": Range(1, integer=True, optional=True),
                            "grace_period": COUNT, "reduction_factor": Range(2, integer=True), "search_seed": SEED,
                            "startup_trials": Range(0, integer=True, optional=True)})
        check_run_name(self.name, "name")
        check_mlflow_names(self.experiment)
        if self.metric in ONCE and self.scheduler == "asha":
            raise ConfigError(f"metric={self.metric} is measured once, after a trial's last epoch: ASHA has no "
                              "intermediate values to stop on; use --scheduler none")
        if self.scheduler == "asha" and "epochs" in self.space:
            raise ConfigError("space knob 'epochs' with scheduler=asha: ASHA compares trials at the same epoch, "
                              "where a short schedule has ended and a long one is still near its peak learning rate, "
                              "so it would stop the long schedules for being half-way; search epochs with "
                              "--scheduler none (or fix --epochs)")
        check_location(self.storage_path, "storage_path")
        if self.pretrain.get("num_workers", 1) < 1:
            raise ConfigError("--workers-per-trial must be ≥ 1: every trial is a Ray Train run")
        validate_space(self.space, self.search, self.pretrain)
        return self

    def check_data_cpus(self, cpus: float, cluster: str) -> None:
        """``ropim.checks.check_data_cpus`` for ``max_concurrent`` trials that read through Ray Data (the default
        concurrency, ``tune.driver.default_concurrency``, leaves each trial a CPU)."""
        p = self.pretrain
        if p.get("ingest") == "ray_data" and self.max_concurrent is not None:
            check_data_cpus(cpus, p["num_workers"], p["cpus_per_worker"], cluster, self.max_concurrent)

    def resolved(self) -> SweepConfig:
        """The same sweep with its local paths (storage, the trials' data source) absolute (``ropim.paths``)."""
        data = self.pretrain.get("data", {})
        pretrain = {**self.pretrain, "data": {**data, "source": resolve_path(data["source"], ("digits",))}} \
            if "source" in data else self.pretrain
        return dataclasses.replace(self, pretrain=pretrain, storage_path=resolve_path(self.storage_path))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> SweepConfig:
        return cls(**d)

    def protocol(self, trial: PretrainConfig) -> str:
        """The sweep metric with what its score depends on, under which the champion rule compares scores: a frozen
        evaluation's k and bank (``FrozenEvalJob.protocol``); a downstream score's recipe, budget and (segmentation)
        data, hashed (``finetune_top1@recipe=…``), the trial's own seed and workers left out."""
        if self.metric not in ONCE:
            return trial.protocol(self.metric)
        from ropim.train.jobs import JOBS

        job = JOBS[self.metric.split("_", 1)[0]].config
        full = job.from_dict(getattr(self, f"trial_{job.NAME}")(trial.to_dict())).to_dict()  # defaults written out
        recipe = {k: v for k, v in full.items() if k not in (*job.RESUMABLE, *NOT_RECIPE)}
        if job.NAME == "finetune":
            del recipe["data"]  # the trial's own: the score's dataset key
        else:  # the segmentation data as the dataset key records a location (``recorded_location``)
            recipe["data"] = {**recipe["data"], "source": recorded_location(recipe["data"]["source"])}
        # numbers as floats: warm-up 1 from a YAML file is the command line's 1.0
        canonical = json.loads(json.dumps(recipe, default=str), parse_int=float)
        digest = hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.metric}@recipe={digest}"

    def trial_finetune(self, pretrain: dict) -> dict:
        """The FinetuneConfig fields of the fine-tune of a trial that pretrained with ``pretrain``: the sweep's
        recipe and budget, on the trial's data, workers and seed; nothing registered."""
        return {**{k: v for k, v in self.finetune.items() if k not in FINETUNE_FROM_TRIAL},
                "data": pretrain["data"], "seed": pretrain["seed"], "registered_model": "",
                **{k: pretrain[k] for k in TRIAL_RESOURCES}}

    def trial_segment(self, pretrain: dict) -> dict:
        """The SegmentConfig fields of a trial's segmentation: the sweep's recipe, budget and segmentation data, on the
        trial's workers and seed; nothing registered (the encoder is the trial's, set by the trial)."""
        return {**self.segment, "seed": pretrain["seed"], "registered_model": "", "run_name": None,
                **{k: pretrain[k] for k in TRIAL_RESOURCES}}
