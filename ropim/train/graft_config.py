"""What an LGP-ROPIM graft is (``GraftConfig``): MoCo v3 training of a registered encoder with LGP's layer-wise
learning rates. Imports nothing heavy, so that the command line parses and validates fast. Defaults are MoCo v3's
ViT recipe (``ropim/presets/graft/`` holds the paper's and the digits one; README "LGP-ROPIM")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from ropim.checks import (
    COUNT,
    POSITIVE,
    Range,
    check_encoder_input,
    check_fields,
    check_local_resources,
    check_location,
    check_run_name,
)
from ropim.data.config import DataConfig
from ropim.errors import ConfigError
from ropim.paths import resolve_path
from ropim.tracking.names import DEFAULT_ENCODER_NAME
from ropim.train.config import LOOP_RULES, LoopConfig
from ropim.train.placement import check_placement
from ropim.train.speed_options import SPEED_RESUMABLE, SpeedOptions, check_precision

# fields that may differ when a named graft is continued; everything else must match the stored config
GRAFT_RESUMABLE = ("num_workers", "use_gpu", "cpus_per_worker", "stop_after_epochs", "max_failures", "log_every",
                   "dataloader_workers", "placement_strategy", "min_workers", *SPEED_RESUMABLE)
LGP_LOWER_SHARE = 2 / 3  # LGP's ViT-B: blocks 1-8 of 12 at the lower rate ("1.5e-5,1.5e-5,1.5e-4" over 3 thirds)


@dataclass(frozen=True)
class GraftConfig(SpeedOptions):
    """MoCo v3 on top of a registered encoder, the lower blocks at a fraction of the rate (LGP); ``ropim graft
    --help`` lists it."""

    encoder: str = f"models:/{DEFAULT_ENCODER_NAME}@champion"  # the first stage: models:/…, runs:/… or a folder
    data: DataConfig = field(default_factory=DataConfig)
    epochs: int = 10
    global_batch_size: int = 128  # images (pairs of views) per optimizer step over all workers
    accum_steps: int = 1  # gradient accumulation: micro batch = global_batch_size / (num_workers × accum_steps)
    base_lr: float = 1.5e-4  # upper blocks' lr = base_lr × global_batch_size / 256 (MoCo v3's rule)
    min_lr: float = 0.0
    warmup_epochs: float = 1.0
    weight_decay: float = 0.1
    beta2: float = 0.999  # AdamW β2 (torch's default, as MoCo v3 uses it)
    lower_blocks: int | None = None  # blocks 0 … lower_blocks−1 (and the embedding) at the lower rate; None: 2/3
    lower_lr_ratio: float = 0.1  # their lr as a share of the upper blocks' (LGP: 1.5e-5 / 1.5e-4)
    temperature: float = 0.2  # MoCo v3's τ for ViT
    momentum: float = 0.99  # m0 of the momentum encoder's EMA
    momentum_cosine: bool = True  # m rises from m0 to 1 on a half cosine over the run (MoCo v3's --moco-m-cos)
    proj_dim: int = 256  # output of projector and predictor
    mlp_dim: int = 4096  # hidden width of projector and predictor
    freeze_patch_embed: bool = True  # MoCo v3's stability fix (--stop-grad-conv1): the patch projection not trained
    crop_min: float = 0.08  # RandomResizedCrop's smallest area share
    drop_path: float = 0.0  # stochastic depth of the encoder while grafting (MoCo v3 uses none)
    clip_grad: float | None = None  # max gradient norm; None: no clipping (MoCo v3)
    # fp32 | auto (bf16 on CPUs with native bf16, else fp32) | bf16 | fp16 (GPU only). fp32 by default: bf16 is
    # unmeasured for this job, and bf16 fine-tuning lost 3.9 points from random init (bench/demo_precision.py)
    precision: str = "fp32"
    num_workers: int = 2  # Ray Train workers; 0 runs the same loop in this process (no Ray)
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    dataloader_workers: int = 0  # DataLoader processes per worker (decoding and the two views' augmentation)
    placement_strategy: str = "PACK"  # workers on the fewest nodes (PACK) or across nodes (SPREAD, STRICT_SPREAD)
    min_workers: int | None = None  # elastic: after a node is lost, restart on as few as this (None: num_workers)
    seed: int = 0
    checkpoint_every: int = 1  # epochs between checkpoints (the last epoch always checkpoints)
    keep_checkpoints: int = 2
    max_failures: int = 1  # worker-group restarts from the latest checkpoint before the run fails
    stop_after_epochs: int | None = None  # train this many epochs in this job, checkpoint, stop (re-run continues)
    max_steps_per_epoch: int | None = None  # cap for smoke runs
    max_skipped_steps: int = 100  # fp16: more consecutive steps skipped by the grad scaler stop the run
    wait_for_resources: bool = False  # wait for GPUs / CPUs the (local) cluster lacks instead of failing
    eval_every: int = 0  # epochs between kNN top-1 evaluations of the encoder on the val split (0 = never)
    eval_linear_probe: bool = False  # on eval epochs also fit a linear probe: linear_top1
    knn_k: int = 20
    log_every: int = 10  # steps between progress lines
    experiment: str = "ropim-graft"
    run_name: str | None = None
    storage_path: str = "ray_results"
    registered_model: str = DEFAULT_ENCODER_NAME  # the grafted encoder: a new version of this model ("": none)

    def resolved(self) -> GraftConfig:
        """Local paths (data, an encoder folder, storage_path) made absolute against the caller's folder."""
        return replace(self, data=self.data.resolved(), encoder=resolve_path(self.encoder),
                       storage_path=resolve_path(self.storage_path))

    def validate(self) -> GraftConfig:
        """Raise ConfigError naming the bad field and its fix, before any Ray or MLflow work."""
        check_location(self.storage_path, "storage_path")
        check_location(self.encoder, "encoder")
        self.data.validate()
        check_fields(self, {**LOOP_RULES, "global_batch_size": COUNT, "accum_steps": COUNT,
                            "beta2": Range(0, 1, high_open=True), "lower_blocks": Range(0, integer=True, optional=True),
                            "lower_lr_ratio": Range(0, 1, low_open=True), "temperature": POSITIVE,
                            "momentum": Range(0, 1, high_open=True), "proj_dim": COUNT, "mlp_dim": COUNT,
                            "crop_min": Range(0, 1, low_open=True), "drop_path": Range(0, 1, high_open=True),
                            "eval_every": Range(0, integer=True), "knn_k": COUNT,
                            "dataloader_workers": Range(0, integer=True)})
        check_run_name(self.run_name)
        workers = max(1, self.num_workers)
        if self.global_batch_size % (workers * self.accum_steps):
            raise ConfigError(f"global_batch_size={self.global_batch_size} is not divisible by "
                              f"num_workers={self.num_workers} × accum_steps={self.accum_steps}")
        micro = self.global_batch_size // (workers * self.accum_steps)
        if micro < 2:
            raise ConfigError(f"global_batch_size={self.global_batch_size}: {micro} image per worker micro batch "
                              f"(num_workers={self.num_workers} × accum_steps={self.accum_steps}); MoCo v3 needs at "
                              "least 2 (batch norm in its MLPs, a negative for every query)")
        for name in ("momentum_cosine", "freeze_patch_embed", "eval_linear_probe"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be true or false")
        check_precision(self.precision, self.use_gpu)
        check_placement(self, self.global_batch_size, self.accum_steps)
        self.check_speed()
        return self

    def check_resources(self) -> None:
        """The workers fit where they will run (``ropim.checks.check_local_resources``)."""
        check_local_resources(self.num_workers, self.cpus_per_worker, self.use_gpu, self.wait_for_resources)

    def split(self, depth: int) -> int:
        """Blocks trained at the lower rate in an encoder of ``depth`` blocks; ConfigError when outside it."""
        lower = int(LGP_LOWER_SHARE * depth) if self.lower_blocks is None else self.lower_blocks
        if not 0 <= lower <= depth:
            raise ConfigError(f"lower_blocks={lower}: the encoder {self.encoder} has {depth} block"
                              f"{'s' if depth != 1 else ''}; the split point must lie in [0, {depth}] (or null for "
                              f"LGP's 2/3: {int(LGP_LOWER_SHARE * depth)})")
        return lower

    def check_encoder(self, uri: str, config: dict) -> None:
        """The encoder takes RGB images at its own size and the split point lies within its blocks (``depth`` of its
        ``config.json``). Needs no torch: the pre-flight runs it on a local folder; the job checks the weights."""
        check_encoder_input(uri, config)
        if "depth" in config:
            self.split(config["depth"])

    @property
    def lr(self) -> float:
        """Peak learning rate of the upper blocks after MoCo v3's linear scaling rule."""
        return self.base_lr * self.global_batch_size / 256

    def loop(self) -> LoopConfig:
        """What the training loop reads."""
        return LoopConfig.of(self, kind="graft")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GraftConfig:
        d = dict(d)
        d["data"] = DataConfig(**d.get("data", {}))
        return cls(**d)
