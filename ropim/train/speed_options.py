"""The speed options of pretraining and fine-tuning: how a training step runs, not what it computes (applied by
``ropim.train.speed``; README "Speed on GPUs")."""

from __future__ import annotations

from dataclasses import dataclass

from ropim.errors import ConfigError

ADAMW_KERNELS = ("default", "foreach", "fused")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
# may change when a named run is continued
SPEED_RESUMABLE = ("compile", "channels_last", "tf32", "pin_memory", "async_checkpoint")


@dataclass(frozen=True)
class SpeedOptions:
    """How a training step runs, not what it computes (README "Speed on GPUs"), for pretraining and fine-tuning;
    each new one stays off until ``bench/gpu_step.py`` measures it faster on a GPU."""

    compile: bool = False  # torch.compile the model's training forward and backward (the first steps compile)
    adamw: str = "default"  # AdamW kernels: default (torch's choice: foreach on CUDA, a loop on CPU), foreach, fused
    channels_last: bool = False  # NHWC images and patch-embedding weights (the patch convolution's tensor-core layout)
    tf32: bool = False  # CUDA: TF32 tensor cores for fp32 matmuls and convolutions (no effect on CPU)
    pin_memory: bool = True  # CUDA + torch ingest: batches in page-locked memory, copied without blocking
    # Ray Train: upload checkpoints in Ray's background thread while the next epoch trains; a worker lost before Ray
    # registers the upload restarts the run one checkpoint further back (off: the loop waits for Ray's commit)
    async_checkpoint: bool = False

    def check_speed(self, flags: tuple[str, ...] = ()) -> None:
        """Raise ConfigError for a bad speed option (or another true/false field named in ``flags``)."""
        for name in ("compile", "channels_last", "tf32", "pin_memory", "async_checkpoint", *flags):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}={getattr(self, name)!r}: must be true or false")
        if self.adamw not in ADAMW_KERNELS:
            raise ConfigError(f"adamw={self.adamw!r}: choose one of {', '.join(ADAMW_KERNELS)}")


def check_precision(precision: str, use_gpu: bool) -> None:
    """Raise ConfigError for an unknown precision, or fp16 (which needs CUDA's grad scaler) without a GPU."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and not use_gpu:
        raise ConfigError("precision='fp16' needs use_gpu=true; use 'bf16' or 'fp32' on CPU")
