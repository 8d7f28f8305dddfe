"""Runtime wiring shared by pretraining and fine-tuning: the Ray session, the TorchTrainer, mixed precision."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import torch

from ropim.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")


def check_precision(precision: str, use_gpu: bool) -> None:
    """Raise ConfigError for an unknown precision, or fp16 (which needs CUDA's grad scaler) without a GPU."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp16" and not use_gpu:
        raise ConfigError("precision='fp16' needs use_gpu=true; use 'bf16' or 'fp32' on CPU")


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of ``precision`` (None for fp32)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def grad_scaler(precision: str) -> torch.amp.GradScaler | None:
    """A CUDA grad scaler for fp16, else None."""
    return torch.amp.GradScaler("cuda") if precision == "fp16" else None


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
                   params: Iterable[torch.nn.Parameter], clip_grad: float | None) -> None:
    """One optimizer step on the accumulated gradients: unscale (fp16), clip to ``clip_grad``, step, zero."""
    if scaler:
        scaler.unscale_(optimizer)
    if clip_grad:
        torch.nn.utils.clip_grad_norm_(params, clip_grad)
    if scaler:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def ray_session(needed: bool = True) -> Iterator[None]:
    """Use this process's Ray session, or (when ``needed``) start one and shut it down on exit.

    ``ray.init()`` joins the cluster of a ``ray job submit`` job (RAY_ADDRESS) or starts a local one. The
    dashboard stays on: Ray Train's placement-group cleaner needs its state API to free a dead run's
    resources, and without it logs "Failed to query Ray Train Controller actor state" every few seconds.
    """
    import ray

    started = needed and not ray.is_initialized()
    if started:
        ray.init()
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def _without_report_lines(train_loop: Callable[[dict], None]) -> Callable[[dict], None]:
    """``train_loop`` with Ray Train's per-report INFO line ("Reporting training result N: TrainingReport(...)",
    once per worker per report, from a logger named after its file that LoggingConfig does not reach) off."""

    @functools.wraps(train_loop)
    def loop(config: dict) -> None:
        from ray.train.v2._internal.execution import context

        logging.getLogger(context.__file__).setLevel(logging.WARNING)
        train_loop(config)

    return loop


def torch_trainer(train_loop: Callable[[dict], None], loop_config: dict, *, num_workers: int, use_gpu: bool,
                  cpus_per_worker: float, run_name: str, storage_path: str, keep_checkpoints: int,
                  max_failures: int, callbacks: list | None = None, datasets: dict | None = None):
    """A TorchTrainer: ``num_workers`` workers, a named run under ``storage_path`` (re-running the name
    resumes from its latest checkpoint), ``keep_checkpoints`` checkpoints, ``max_failures`` restarts.
    Ray Train's own per-report INFO lines are off; the loops print their progress themselves."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        _without_report_lines(train_loop),
        train_loop_config=loop_config,
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": cpus_per_worker}),
        run_config=RunConfig(
            name=run_name,
            storage_path=storage_path if "://" in storage_path else str(Path(storage_path).absolute()),
            checkpoint_config=CheckpointConfig(num_to_keep=keep_checkpoints),
            failure_config=FailureConfig(max_failures=max_failures),
            callbacks=callbacks or [],
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
