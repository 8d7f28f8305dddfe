"""What a pretraining or fine-tuning job is (``PretrainConfig``, ``FinetuneConfig``) and what the training loop
reads from it (``LoopConfig``). Imports nothing heavy, so that the command line parses and validates fast."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field, replace

from ropim.checks import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    SHARE,
    Range,
    check_fields,
    check_local_resources,
    check_location,
    check_run_name,
)
from ropim.core.config import ModelConfig
from ropim.data.config import DataConfig
from ropim.errors import ConfigError
from ropim.paths import resolve_path
from ropim.tracking.names import DEFAULT_CLASSIFIER_NAME, DEFAULT_ENCODER_NAME
from ropim.train.placement import check_placement
from ropim.train.speed_options import SPEED_RESUMABLE, SpeedOptions, check_precision

INGESTS = ("torch", "ray_data")
# Fields that may differ when a named run is continued; everything else must match the stored config.
PRETRAIN_RESUMABLE = ("num_workers", "use_gpu", "stop_after_epochs", "max_failures", "log_every", "cpus_per_worker",
                      "placement_strategy", "min_workers", "eval_async", *SPEED_RESUMABLE)
FINETUNE_RESUMABLE = ("num_workers", "use_gpu", "cpus_per_worker", "stop_after_epochs", "max_failures", "log_every",
                      "dataloader_workers", "placement_strategy", "min_workers", *SPEED_RESUMABLE)


@dataclass(frozen=True)
class LoopConfig:
    """What the one training loop needs to know about a job."""

    kind: str  # progress-line prefix: pretrain | finetune | random-init
    epochs: int
    global_batch_size: int  # images per optimizer step over all workers
    lr: float  # peak learning rate
    min_lr: float
    warmup_epochs: float
    seed: int
    accum_steps: int = 1
    clip_grad: float | None = None
    precision: str = "auto"  # resolved on the worker's device (``ropim.train.speed.resolve_precision``)
    checkpoint_every: int = 1
    stop_after_epochs: int | None = None
    max_steps_per_epoch: int | None = None
    eval_every: int = 0  # 0 = never
    log_every: int = 10
    max_skipped_steps: int = 100  # fp16: consecutive steps the grad scaler may skip before the run stops
    compile: bool = False  # torch.compile the model for training (SpeedOptions)
    channels_last: bool = False
    tf32: bool = False
    async_checkpoint: bool = False  # Ray Train: checkpoints upload while the next epoch trains (SpeedOptions)
    schedule: str = "cosine"  # after the linear warm-up: cosine to min_lr, or poly (power 1: linear) to min_lr

    @classmethod
    def of(cls, job: object, **fields) -> LoopConfig:
        """The loop settings of a job config: each field ``job`` has under the same name (``lr`` is its peak rate,
        ``kind`` its progress prefix), then ``fields`` (what it names otherwise, e.g. ``global_batch_size``)."""
        shared = {f.name: getattr(job, f.name) for f in dataclasses.fields(cls) if hasattr(job, f.name)}
        return cls(**{**shared, **fields})

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


# rules every training job shares (LoopConfig's fields and where the job runs)
LOOP_RULES = {
    "epochs": COUNT, "base_lr": POSITIVE, "min_lr": NON_NEGATIVE, "warmup_epochs": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE, "clip_grad": Range(0, low_open=True, optional=True),
    "num_workers": Range(0, integer=True),
    "cpus_per_worker": POSITIVE, "seed": SEED, "checkpoint_every": COUNT, "keep_checkpoints": COUNT,
    "max_failures": Range(-1, integer=True), "stop_after_epochs": Range(1, integer=True, optional=True),
    "max_steps_per_epoch": Range(1, integer=True, optional=True), "log_every": COUNT, "max_skipped_steps": COUNT,
}


@dataclass(frozen=True)
class PretrainConfig(SpeedOptions):
    """Everything one pretraining run needs; ``ropim pretrain --help`` lists it."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(img_size=32, patch_size=4))
    data: DataConfig = field(default_factory=DataConfig)
    epochs: int = 10
    global_batch_size: int = 128
    accum_steps: int = 1  # gradient accumulation: micro batch = global_batch_size / (num_workers × accum_steps)
    base_lr: float = 1e-3  # lr = base_lr × global_batch_size / 512
    min_lr: float = 1e-6
    warmup_epochs: float = 1.0
    weight_decay: float = 0.05
    beta2: float = 0.95
    clip_grad: float | None = 5.0  # max gradient norm (the paper's 5.0); None = no clipping
    # auto (bf16 on native-bf16 CPUs, else fp32) | fp32 | bf16 | fp16 (GPU); bf16 pretraining kept the demo's
    # scores over 3 seeds (bench/demo_precision.py) at 1.94x the fp32 step (bench/cpu_step.py)
    precision: str = "auto"
    num_workers: int = 2  # Ray Train workers; 0 runs the same loop in this process (no Ray)
    use_gpu: bool = False
    cpus_per_worker: float = 1.0  # with ingest=ray_data leave CPUs to Ray Data: 0.5 for 2 workers on 2 CPUs
    placement_strategy: str = "PACK"  # workers on the fewest nodes (PACK) or across nodes (SPREAD, STRICT_SPREAD)
    min_workers: int | None = None  # elastic: after a node is lost, restart on as few as this (None: num_workers)
    ingest: str = "torch"  # torch: a DataLoader per worker; ray_data: Ray Data decode/augment tasks, sharded
    seed: int = 0
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always checkpoints)
    keep_checkpoints: int = 2
    max_failures: int = 1  # worker-group restarts from the latest checkpoint before the run fails
    stop_after_epochs: int | None = None  # train this many epochs in this job, checkpoint, stop (resume later)
    max_steps_per_epoch: int | None = None  # cap for smoke runs
    max_skipped_steps: int = 100  # fp16: more consecutive steps skipped by the grad scaler stop the run
    wait_for_resources: bool = False  # wait for GPUs / CPUs the (local) cluster lacks instead of failing
    eval_every: int = 0  # epochs between kNN top-1 evaluations on the val split (0 = never)
    eval_linear_probe: bool = False  # on eval epochs also fit a linear probe (ropim.eval.linear): linear_top1
    eval_async: bool = True  # eval epochs before the job's last run beside training (false: inline, what ASHA needs)
    viz_every: int = 10  # epochs between reconstruction-grid PNGs logged to MLflow (0 = never; last epoch too)
    knn_k: int = 20
    log_every: int = 10  # steps between progress lines
    experiment: str = "ropim-pretrain"
    run_name: str | None = None
    storage_path: str = "ray_results"
    registered_model: str = DEFAULT_ENCODER_NAME

    def validate(self) -> PretrainConfig:
        """Raise ConfigError naming the bad field and its fix, before any Ray or MLflow work."""
        check_location(self.storage_path, "storage_path")
        self.model.validate()
        self.data.validate()
        check_fields(self, {**LOOP_RULES, "global_batch_size": COUNT, "accum_steps": COUNT,
                            "beta2": Range(0, 1, high_open=True), "eval_every": Range(0, integer=True),
                            "viz_every": Range(0, integer=True), "knn_k": COUNT})
        check_run_name(self.run_name)
        workers = max(1, self.num_workers)
        if self.global_batch_size % (workers * self.accum_steps):
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not divisible by num_workers={self.num_workers} "
                f"× accum_steps={self.accum_steps}"
            )
        check_precision(self.precision, self.use_gpu)
        check_placement(self, self.global_batch_size, self.accum_steps)
        self.check_speed(("eval_async",))
        if self.ingest not in INGESTS:
            raise ConfigError(f"ingest={self.ingest!r}: choose one of {', '.join(INGESTS)}")
        if self.num_workers == 0 and self.ingest == "ray_data":
            raise ConfigError("ingest='ray_data' needs num_workers ≥ 1 (Ray Train); use ingest='torch' in-process")
        return self

    def check_resources(self) -> None:
        """The workers fit where they will run (``ropim.checks.check_local_resources``)."""
        check_local_resources(self.num_workers, self.cpus_per_worker, self.use_gpu, self.wait_for_resources)

    def resolved(self) -> PretrainConfig:
        """The same config with its local paths (data source, storage) absolute (``ropim.paths``)."""
        return replace(self, data=self.data.resolved(), storage_path=resolve_path(self.storage_path))

    @property
    def lr(self) -> float:
        """Peak learning rate after the linear scaling rule."""
        return self.base_lr * self.global_batch_size / 512

    def loop(self) -> LoopConfig:
        """What the training loop reads."""
        return LoopConfig.of(self, kind="pretrain")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PretrainConfig:
        d = dict(d)
        d["model"] = ModelConfig(**{"backbone": "vit", **d.get("model", {})})  # stored before backbones: vit
        d["data"] = DataConfig(**d.get("data", {}))
        return cls(**d)


@dataclass(frozen=True)
class FinetuneConfig(SpeedOptions):
    """A fine-tune of a registered encoder (the paper's recipe by default); ``ropim finetune --help`` lists it."""

    encoder: str = f"models:/{DEFAULT_ENCODER_NAME}@champion"
    random_init: bool = False  # same architecture, weights not loaded: the from-scratch baseline
    data: DataConfig = field(default_factory=DataConfig)
    img_size: int | None = None  # None: the encoder's; another size resamples the position embedding
    epochs: int = 10
    batch_size: int = 64  # global: split over num_workers
    base_lr: float = 5e-3  # lr = base_lr × batch_size / 512 (the paper's grid: 5e-3, 1e-2, 2e-2)
    min_lr: float = 1e-6
    warmup_epochs: float = 5.0
    weight_decay: float = 0.05
    layer_decay: float = 0.75
    drop_path: float = 0.1
    label_smoothing: float = 0.1
    mixup: float = 0.8
    cutmix: float = 1.0
    randaugment: str = "rand-m9-mstd0.5-inc1"  # timm's RandAugment 9 / 0.5; "" disables
    reprob: float = 0.25
    crop_scale_min: float = 0.08
    hflip: float = 0.5
    clip_grad: float | None = None
    # fp32 | auto (bf16 on CPUs with native bf16, else fp32) | bf16 | fp16 (GPU only). fp32 by default: bf16
    # fine-tuning lost 3.9 points from random init in the demo (bench/demo_precision.py), pretraining none
    precision: str = "fp32"
    num_workers: int = 2  # Ray Train workers; 0 runs the same loop in this process (no Ray)
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    placement_strategy: str = "PACK"  # workers on the fewest nodes (PACK) or across nodes (SPREAD, STRICT_SPREAD)
    min_workers: int | None = None  # elastic: after a node is lost, restart on as few as this (None: num_workers)
    dataloader_workers: int = 0  # DataLoader processes per worker
    seed: int = 0
    eval_every: int = 1  # epochs between val evaluations (the last epoch always evaluates)
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always checkpoints)
    keep_checkpoints: int = 2
    max_failures: int = 1  # worker-group restarts from the latest checkpoint before the run fails
    stop_after_epochs: int | None = None  # train this many epochs in this job, checkpoint, stop (re-run continues)
    max_steps_per_epoch: int | None = None  # cap for smoke runs
    max_skipped_steps: int = 100  # fp16: more consecutive steps skipped by the grad scaler stop the run
    wait_for_resources: bool = False  # wait for GPUs / CPUs the (local) cluster lacks instead of failing
    log_every: int = 20  # steps between progress lines
    experiment: str = "ropim-finetune"
    run_name: str | None = None
    storage_path: str = "ray_results"
    registered_model: str = DEFAULT_CLASSIFIER_NAME  # "" = do not register the classifier

    def validate(self) -> FinetuneConfig:
        """Raise ConfigError naming the bad field and its fix."""
        check_location(self.storage_path, "storage_path")
        check_location(self.encoder, "encoder")
        self.data.validate()
        check_fields(self, {**LOOP_RULES, "batch_size": COUNT, "eval_every": COUNT,
                            "layer_decay": Range(0, 1, low_open=True), "drop_path": Range(0, 1, high_open=True),
                            "label_smoothing": Range(0, 1, high_open=True), "mixup": NON_NEGATIVE,
                            "cutmix": NON_NEGATIVE, "reprob": SHARE, "crop_scale_min": Range(0, 1, low_open=True),
                            "hflip": SHARE, "dataloader_workers": Range(0, integer=True),
                            "img_size": Range(1, integer=True, optional=True)})
        check_run_name(self.run_name)
        workers = max(1, self.num_workers)
        if self.batch_size % workers:
            raise ConfigError(f"batch_size={self.batch_size} is not divisible by num_workers={self.num_workers}")
        if (self.mixup > 0 or self.cutmix > 0) and (self.batch_size // workers) % 2:
            raise ConfigError(f"batch_size={self.batch_size}: Mixup/CutMix needs an even batch per worker "
                              f"(here {self.batch_size // workers}); change batch_size or set mixup=0 cutmix=0")
        check_precision(self.precision, self.use_gpu)
        check_placement(self, self.batch_size)
        self.check_speed()
        return self

    def check_resources(self) -> None:
        """The workers fit where they will run (``ropim.checks.check_local_resources``)."""
        check_local_resources(self.num_workers, self.cpus_per_worker, self.use_gpu, self.wait_for_resources)

    def resolved(self) -> FinetuneConfig:
        """The same config with its local paths (encoder folder, data source, storage) absolute (``ropim.paths``)."""
        return replace(self, encoder=resolve_path(self.encoder), data=self.data.resolved(),
                       storage_path=resolve_path(self.storage_path))

    @property
    def lr(self) -> float:
        """Peak learning rate after the linear scaling rule."""
        return self.base_lr * self.batch_size / 512

    @property
    def kind(self) -> str:
        """``finetune``, or ``random-init`` for the from-scratch baseline."""
        return "random-init" if self.random_init else "finetune"

    def loop(self) -> LoopConfig:
        """What the training loop reads."""
        return LoopConfig.of(self, global_batch_size=self.batch_size)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FinetuneConfig:
        d = dict(d)
        d["data"] = DataConfig(**d.get("data", {}))
        return cls(**d)
