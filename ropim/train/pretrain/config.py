"""What a pretraining job is (``PretrainConfig``): its own fields and rules beside what every job shares
(``ropim.train.job``). Imports nothing heavy, so that the command line parses and validates fast."""

from __future__ import annotations

from dataclasses import dataclass, field

from ropim.checks import COUNT, POSITIVE, OneOf, Range, check_data_cpus, local_cpus
from ropim.core.config import ModelConfig
from ropim.errors import ConfigError
from ropim.tracking.names import DEFAULT_ENCODER_NAME
from ropim.train.frozen_eval import FrozenEvalJob

ASYNC_BANK = 200_000  # train images an evaluation beside training (rank 0 alone) takes at most


@dataclass(frozen=True)
class PretrainConfig(FrozenEvalJob):
    """Everything one pretraining run needs; ``ropim pretrain --help`` lists it."""

    NAME = "pretrain"
    RULES = {**FrozenEvalJob.RULES, "base_lr": POSITIVE, "global_batch_size": COUNT,
             "beta2": Range(0, 1, high_open=True), "viz_every": Range(0, integer=True),
             "ingest": OneOf(("torch", "ray_data"))}
    RESUMABLE = (*FrozenEvalJob.RESUMABLE, "eval_async")

    model: ModelConfig = field(default_factory=lambda: ModelConfig(img_size=32, patch_size=4))
    """the encoder, its corruption and its loss (``--model.*``)"""
    global_batch_size: int = 128
    """images per optimizer step over all workers"""
    base_lr: float = 1e-3
    """lr = base_lr × global_batch_size / 512"""
    beta2: float = 0.95
    """AdamW β2 (the paper's 0.95)"""
    clip_grad: float | None = 5.0
    """max gradient norm (the paper's 5.0); None = no clipping"""
    precision: str = "auto"
    """auto (bf16 on native-bf16 CPUs, else fp32) | fp32 | bf16 | fp16 (GPU); bf16 pretraining kept the demo's
    scores over 3 seeds (bench/demo_precision.py) at 1.2-1.7x the fp32 step (bench/cpu_step.py, docs/speed.md)"""
    ingest: str = "torch"
    """torch: a DataLoader per worker; ray_data: Ray Data decode/augment tasks, sharded"""
    eval_async: bool = True
    """eval epochs before the job's last run beside training, on rank 0 alone (false: inline, every worker extracting
    its share; what ASHA needs, and what a bank over 200,000 train images takes)"""
    viz_every: int = 10
    """epochs between reconstruction-grid PNGs logged to MLflow (0 = never; last epoch too)"""
    experiment: str = "ropim-pretrain"
    registered_model: str = DEFAULT_ENCODER_NAME

    def check_inputs(self) -> None:
        self.model.validate()
        super().check_inputs()

    def check(self) -> None:
        if self.num_workers == 0 and self.ingest == "ray_data":
            raise ConfigError("ingest='ray_data' needs num_workers ≥ 1 (Ray Train); use ingest='torch' in-process")

    def check_bank(self, train_items: int) -> None:
        """``FrozenEvalJob.check_bank``; and evaluations beside training (``eval_async``: rank 0 alone extracts the
        whole bank, holds its features and searches it on the CPU, every ``eval_every`` epochs) over a bank of more
        than ``ASYNC_BANK`` images on several workers are refused, naming the two fixes."""
        super().check_bank(train_items)
        bank = min(train_items, self.eval_train_images or train_items)
        if self.eval_async and 0 < self.eval_every < self.epochs and self.num_workers > 1 and bank > ASYNC_BANK:
            raise ConfigError(f"eval_async=true with a kNN bank of {bank:,} train images: every {self.eval_every} "
                              "epochs rank 0 alone would extract them all beside training, hold their features and "
                              f"search them on its CPU (hours at ImageNet size, and GiBs beside training's); give "
                              f"--eval_async false (each of the {self.num_workers} workers extracts and searches its "
                              f"share) or --eval_train_images {ASYNC_BANK // 4} (a sample)")

    def check_resources(self) -> None:
        """The workers fit this machine, and with ``ingest=ray_data`` leave Ray Data a CPU of the local cluster
        (joined by address: ``check_cluster``, once connected)."""
        super().check_resources()
        cpus = local_cpus()
        if self.ingest == "ray_data" and cpus is not None:
            check_data_cpus(cpus, self.num_workers, self.cpus_per_worker, "this machine (the local Ray cluster)")

    def check_cluster(self, cpus: float, gpus: float, cluster: str) -> None:
        """With ``ingest=ray_data``, workers that fit the cluster as it is must leave Ray Data a CPU of it. Workers
        that do not fit yet wait for nodes (``wait_for_resources``, an autoscaler) and are not judged here."""
        if self.ingest == "ray_data" and not self.wait_for_resources and (not self.use_gpu or self.num_workers <= gpus):
            check_data_cpus(cpus, self.num_workers, self.cpus_per_worker, cluster)

    @property
    def lr(self) -> float:
        """Peak learning rate after the linear scaling rule."""
        return self.base_lr * self.global_batch_size / 512

    @classmethod
    def from_dict(cls, d: dict) -> PretrainConfig:
        model = {"backbone": "vit", **d.get("model", {})}  # stored before backbones: vit
        return super().from_dict({**d, "model": model})
