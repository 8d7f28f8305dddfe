"""What every training job is (``JobConfig``; ``ropim.train.encoder_job`` for the jobs that start from an encoder)
which is also what the training loop reads. A job's config declares only its own fields and rules; the fields
shared by every job, the resumable set, the checks, the resources and the dict round trip are here.
Imports nothing heavy, so that the command line parses and validates fast."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar

from ropim.checks import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    OneOf,
    Range,
    Rule,
    check_fields,
    check_local_resources,
    check_location,
    check_mlflow_names,
    check_run_name,
)
from ropim.data.config import DataConfig
from ropim.errors import ConfigError
from ropim.paths import resolve_path

SPEED_FLAGS = ("compile", "channels_last", "tf32", "pin_memory", "async_checkpoint")


def dataset_name(data: DataConfig) -> str:
    """A short name of the data for tags, run names and tables: 'digits', or the last part of a path / URI."""
    name = getattr(data, "name", None) or data.source.rstrip("/").split("?")[0].rsplit("/", 1)[-1]
    name = re.sub(r"\.(parquet|tar|zip)$", "", name)
    return re.sub(r"[^A-Za-z0-9_\-]+", "_", name).strip("_") or "data"


@dataclass(frozen=True)
class JobConfig:
    """The fields, checks and round trip every training job shares; a job's config adds its own fields (and
    redeclares a shared one only to give it another default). ``ropim <job> --help`` lists these first.

    The speed options say how a training step runs, not what it computes (README "Speed on GPUs"); each new one
    stays off until ``bench/gpu_step.py`` measures it faster on a GPU."""

    NAME: ClassVar[str] = ""  # the job's name: its command, progress prefix and MLflow tag (``ropim.train.jobs``)
    BATCH: ClassVar[str] = "global_batch_size"  # the field holding the images per optimizer step over all workers
    # the rules of the fields every job shares (the loop's and where the job runs); a job adds its own
    RULES: ClassVar[dict[str, Rule]] = {
        "epochs": COUNT, "min_lr": NON_NEGATIVE, "warmup_epochs": NON_NEGATIVE, "weight_decay": NON_NEGATIVE,
        "clip_grad": Range(0, low_open=True, optional=True), "num_workers": Range(0, integer=True),
        "accum_steps": COUNT, "cpus_per_worker": POSITIVE, "seed": SEED, "checkpoint_every": COUNT,
        "keep_checkpoints": COUNT, "max_failures": Range(-1, integer=True),
        "stop_after_epochs": Range(1, integer=True, optional=True),
        "max_steps_per_epoch": Range(1, integer=True, optional=True), "log_every": COUNT, "max_skipped_steps": COUNT,
        "dataloader_workers": Range(0, integer=True), "precision": OneOf(("auto", "fp32", "bf16", "fp16")),
        "adamw": OneOf(("default", "foreach", "fused")),
        "placement_strategy": OneOf(("PACK", "SPREAD", "STRICT_SPREAD", "STRICT_PACK")),  # Ray's strategies
    }
    # fields that may differ when a named run is continued; everything else must match the stored config
    # (num_workers between counts of Ray Train workers: ``ropim.train.jobs.check_stored_run``; registered_model: what
    # the result is registered as, not what the run computes; accum_steps: the same global batch in more micro batches,
    # the fix for a run continued on fewer GPUs)
    RESUMABLE: ClassVar[tuple[str, ...]] = ("num_workers", "use_gpu", "cpus_per_worker", "stop_after_epochs",
                                            "max_failures", "log_every", "placement_strategy", "min_workers",
                                            "wait_for_resources", "dataloader_workers", "registered_model",
                                            "accum_steps", *SPEED_FLAGS)
    # the loop's decay after the linear warm-up: cosine to min_lr, or poly (power 1: linear) to min_lr
    schedule: ClassVar[str] = "cosine"
    # False: the schedule spans every step, the warm-up inside its first steps (timm's default: the paper's ROPIM and
    # fine-tuning); True: it spans the steps after the warm-up (MoCo v3's and LGP's adjust_learning_rate: the decay
    # starts at the peak and runs over the remaining epochs)
    warmup_prefix: ClassVar[bool] = False

    compile: bool = False
    """torch.compile the model's training forward and backward (the first steps compile)"""
    adamw: str = "default"
    """AdamW kernels: default (torch's choice: foreach on CUDA, a loop on CPU), foreach, fused"""
    channels_last: bool = False
    """NHWC images and patch-embedding weights (the patch convolution's tensor-core layout)"""
    tf32: bool = False
    """CUDA: TF32 tensor cores for fp32 matmuls (no effect on CPU); cuDNN's convolutions (the patch embedding,
    UperNet's) use TF32 either way, torch's default"""
    pin_memory: bool = True
    """CUDA + torch ingest: batches in page-locked memory, copied without blocking"""
    async_checkpoint: bool = False
    """Ray Train: upload checkpoints in Ray's background thread while the next epoch trains; a worker lost before
    Ray registers the upload restarts the run one checkpoint further back (off: the loop waits for Ray's commit)"""
    data: DataConfig = field(default_factory=DataConfig)
    """where the images come from and how they are split (``--data.*``)"""
    epochs: int = 10
    """epochs of the whole run (the schedule spans them; ``stop_after_epochs`` stops earlier)"""
    accum_steps: int = 1
    """gradient accumulation: micro batch per worker = the global batch / (num_workers × accum_steps)"""
    min_lr: float = 1e-6
    """the learning rate the schedule decays to"""
    warmup_epochs: float = 1.0
    """epochs of linear warm-up from 0 to the peak learning rate"""
    weight_decay: float = 0.05
    """AdamW's decoupled weight decay"""
    clip_grad: float | None = None
    """max gradient norm; None: no clipping"""
    precision: str = "fp32"
    """fp32 | auto (bf16 on CPUs with native bf16, else fp32) | bf16 | fp16 (GPU only). fp32 by default: bf16 is
    unmeasured for most jobs, and bf16 fine-tuning lost 3.9 points from random init (bench/demo_precision.py)"""
    num_workers: int = 2
    """Ray Train workers; 0 runs the same loop in this process (no Ray)"""
    use_gpu: bool = False
    """one GPU per worker"""
    cpus_per_worker: float = 1.0
    """logical CPUs Ray reserves per worker"""
    dataloader_workers: int = 0
    """DataLoader processes per worker that decode: its training images while it trains (torch ingest; Ray Data's
    tasks decode pretraining's with ingest=ray_data) and its evaluations' images"""
    placement_strategy: str = "PACK"
    """workers on the fewest nodes (PACK) or across nodes (SPREAD, STRICT_SPREAD)"""
    min_workers: int | None = None
    """elastic: after a node is lost, restart on as few as this (None: num_workers)"""
    seed: int = 0
    """seeds the model's initialisation, the data order and the augmentations"""
    checkpoint_every: int = 1
    """epochs between checkpoints (the last epoch always checkpoints)"""
    keep_checkpoints: int = 2
    """checkpoints kept in storage_path (the newest)"""
    max_failures: int = 1
    """worker-group restarts from the latest checkpoint before the run fails"""
    stop_after_epochs: int | None = None
    """train this many epochs in this job, checkpoint, stop (re-run continues)"""
    max_steps_per_epoch: int | None = None
    """cap for smoke runs"""
    max_skipped_steps: int = 100
    """fp16: more consecutive steps skipped by the grad scaler stop the run"""
    wait_for_resources: bool = False
    """wait for GPUs / CPUs the (local) cluster lacks instead of failing"""
    eval_every: int = 0
    """epochs between evaluations on the val split (0 = never; the last epoch too when not 0)"""
    log_every: int = 10
    """steps between progress lines"""
    experiment: str = ""
    """the MLflow experiment (each job names its own)"""
    run_name: str | None = None
    """the MLflow run and the checkpoint folder's name (None: the job, date and a suffix)"""
    storage_path: str = "ray_results"
    """where checkpoints go: a folder or a URI (s3://…)"""
    registered_model: str = ""
    """what the job registers its result as ("" = do not register)"""

    @property
    def kind(self) -> str:
        """What the run is: its progress prefix and the MLflow tag ``ropim.kind``."""
        return self.NAME

    @property
    def run_prefix(self) -> str:
        """What a run's default name starts with (then the date, the time and a random suffix)."""
        return self.kind

    @property
    def batch(self) -> int:
        """Images per optimizer step over all workers."""
        return getattr(self, self.BATCH)

    @property
    def lr(self) -> float:
        """The peak learning rate (a job's field, or its rule from a base rate and the batch)."""
        raise NotImplementedError(f"{type(self).__name__} gives no learning rate")

    def version_scores(self, metrics: dict[str, float]) -> dict[str, float | str]:
        """The tags a registered version gets of its run's final ``metrics`` (none here: the fine-tune's and the
        segmentation's scores are in their registered configs)."""
        return {}

    def last_epoch(self, start_epoch: int) -> int:
        """The epoch this job stops after (``stop_after_epochs`` from ``start_epoch``, at most ``epochs``)."""
        return self.epochs if self.stop_after_epochs is None else min(self.epochs, start_epoch + self.stop_after_epochs)

    def evaluates(self, epoch: int, last_epoch: int) -> bool:
        """Whether epoch ``epoch`` (1-based) is evaluated: every ``eval_every``, the final and the job's last."""
        return bool(self.eval_every) and (epoch % self.eval_every == 0 or epoch in (self.epochs, last_epoch))

    def steps_per_epoch(self, available: int) -> int:
        """Optimizer steps per epoch when the data gives ``available``: at most ``max_steps_per_epoch``."""
        return min(available, self.max_steps_per_epoch or available)

    def checkpoints(self, epoch: int, last_epoch: int) -> bool:
        """Whether epoch ``epoch`` (1-based) writes a checkpoint: every ``checkpoint_every`` and the job's last."""
        return epoch == last_epoch or epoch % self.checkpoint_every == 0

    def validate(self):
        """Raise ConfigError naming the bad field and its fix, before any Ray or MLflow work; return the config."""
        check_location(self.storage_path, "storage_path")
        self.check_inputs()
        check_fields(self, self.RULES)
        check_run_name(self.run_name)
        check_mlflow_names(self.experiment, self.registered_model)
        workers = max(1, self.num_workers)
        if self.batch % (workers * self.accum_steps):
            parts = [f"num_workers={self.num_workers}"] * bool(self.num_workers) + \
                [f"accum_steps={self.accum_steps}"] * (self.accum_steps > 1)
            raise ConfigError(f"{self.BATCH}={self.batch} is not divisible by {' × '.join(parts)}")
        if self.min_lr > self.lr:
            raise ConfigError(f"min_lr={self.min_lr} is above the peak learning rate {self.lr:.3g}: the schedule would "
                              "rise, not decay; lower min_lr (or raise the learning rate)")
        if self.precision == "fp16" and not self.use_gpu:
            raise ConfigError("precision='fp16' needs use_gpu=true; use 'bf16' or 'fp32' on CPU")
        self.check_placement()
        self.check()
        return self

    def check_inputs(self) -> None:
        """What the job reads is well formed: the data source (and the model or encoder it names)."""
        self.data.validate()

    def check(self) -> None:
        """The job's own rules between fields (none here)."""

    def check_data(self) -> int:
        """The training split holds a global batch and its first images decode (``check_batch_fits``); returns its
        item count."""
        from ropim.data.sources import check_batch_fits  # pyarrow, no torch

        return check_batch_fits(self.data, {self.BATCH: self.batch})

    def check_placement(self) -> None:
        """``min_workers`` (elastic) lies in [1, num_workers] and the global batch splits evenly over it too (as over
        ``num_workers``). Counts in between take ``batch // workers`` each: the global batch then shrinks by less than
        one micro batch, the step count and schedule stay (``ropim.train.task.epoch_steps``)."""
        if self.min_workers is None:
            return
        if not Range(1, self.num_workers, integer=True).holds(self.min_workers):
            raise ConfigError(f"min_workers={self.min_workers!r}: must be an integer in [1, num_workers="
                              f"{self.num_workers}] (or null: always num_workers)")
        if self.batch % (self.min_workers * self.accum_steps):
            raise ConfigError(f"min_workers={self.min_workers}: the global batch of {self.batch} is not divisible by "
                              f"min_workers={self.min_workers}" + (f" × accum_steps={self.accum_steps}"
                                                                   if self.accum_steps > 1 else "")
                              + ", the worker count an elastic restart may fall back to")

    def check_resources(self) -> None:
        """The workers fit where they will run (``ropim.checks.check_local_resources``)."""
        check_local_resources(self.num_workers, self.cpus_per_worker, self.use_gpu, self.wait_for_resources)

    def check_cluster(self, cpus: float, gpus: float, cluster: str) -> None:
        """What the job needs of the Ray cluster it joined (``cpus``, ``gpus`` of ``cluster``, read after connecting,
        before the trainer starts), beyond the workers fitting; nothing here (``ingest=ray_data`` needs CPUs left)."""

    def resolved(self):
        """The same config with its local paths (data source, storage) absolute (``ropim.paths``): workers may run in
        another folder."""
        return replace(self, data=self.data.resolved(), storage_path=resolve_path(self.storage_path))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict):
        """The config a ``to_dict`` gave (nested configs rebuilt from their dicts)."""
        hints = typing.get_type_hints(cls)
        return cls(**{k: hints[k](**v) if dataclasses.is_dataclass(hints.get(k)) else v for k, v in d.items()})
