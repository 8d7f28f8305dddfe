"""The finite-loss guard of the training loop: a step whose gradients are not finite never reaches the weights.

Without fp16 the first such step stops the run; under fp16 the grad scaler skips such steps, and more than
``max_skipped_steps`` in a row stop it. Stopping writes ``stopped.json`` into the run's folder; the job's driver then
raises ``Diverged`` — one clear error naming the step, the loss and the likely cause — so the run ends FAILED, keeps
its last good checkpoint and registers nothing. (Raising in the workers instead would make Ray Train restart them
from the same checkpoint into the same divergence.)

An input error a worker meets (a bad image under ``fail``, a shard cut short: the same input fails the same way
every time) is recorded the same way, in ``input_error.json``: Ray Train restarts the workers (``max_failures``),
and the restarted attempt stops at once on the record instead of training up to the same file again.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs
import torch

from ropim.errors import ConfigError
from ropim.filesystems import filesystem, write_whole

STOP_FILE = "stopped.json"
INPUT_ERROR_FILE = "input_error.json"


class Diverged(ConfigError):
    """The loss or the gradients stopped being finite; the message names the step and the likely cause."""


@dataclass
class StepGuard:
    """Optimizer steps that check the gradient norm first (one device sync per step)."""

    clip_grad: float | None
    max_skipped_steps: int
    precision: str
    skipped: int = 0  # fp16: consecutive steps the grad scaler skipped

    def step(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None,
             params: Callable[[], Iterator[torch.nn.Parameter]],
             describe: Callable[[float], str]) -> torch.Tensor | None:
        """Unscale (fp16), clip to ``clip_grad``, check, step, zero; ``describe(norm)`` words a divergence. Returns the
        gradients' total norm before clipping (a 0-d tensor on their device), None for a step fp16's scaler skipped."""
        if scaler:
            scaler.unscale_(optimizer)
        grads = [p for p in params() if p.grad is not None]
        if self.clip_grad:
            norm = torch.nn.utils.clip_grad_norm_(grads, self.clip_grad)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in grads])
        finite = bool(torch.isfinite(norm))
        if scaler:
            scaler.step(optimizer)  # skips the update itself when the gradients are not finite
            scaler.update()
            self.skipped = 0 if finite else self.skipped + 1
            if self.skipped > self.max_skipped_steps:
                raise Diverged(f"{describe(float(norm))}; the fp16 grad scaler skipped {self.skipped} steps in a row "
                               f"(max_skipped_steps={self.max_skipped_steps}): train in bf16 or fp32, or lower base_lr")
        elif not finite:
            raise Diverged(f"{describe(float(norm))}: lower base_lr or set clip_grad"
                           + (f", or train in fp32 (precision={self.precision})" if self.precision != "fp32" else ""))
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm.detach() if finite else None


def write_stop(run_dir: str, message: str, epoch: int, step: int) -> None:
    """Record why the run stopped, for its driver."""
    write_record(run_dir, STOP_FILE, {"message": message, "epoch": epoch, "step": step})


def take_records(run_dir: str) -> dict | None:
    """Clear the run's records, a stop and an input error (an earlier job's are history as a job starts, and its own
    once it ends), with one filesystem (opening an S3 one asks the bucket's region); the stop's, None without one."""
    fs, root = filesystem(run_dir)
    read_record(fs, f"{root}/{INPUT_ERROR_FILE}", remove=True)
    return read_record(fs, f"{root}/{STOP_FILE}", remove=True)


def write_input_error(run_dir: str, err: ConfigError) -> None:
    """Record the input error a worker met, for the attempts Ray Train restarts."""
    kind = type(err)
    write_record(run_dir, INPUT_ERROR_FILE, {"message": str(err), "type": f"{kind.__module__}:{kind.__name__}"})


def input_error_met(run_dir: str) -> ConfigError | None:
    """The input error an earlier attempt of this job met (``write_input_error``), as that attempt raised it (a
    ``ConfigError`` of ropim's), or None."""
    record = read_record(*filesystem(f"{run_dir}/{INPUT_ERROR_FILE}"))
    if record is None:
        return None
    module, _, name = record.get("type", "").partition(":")
    kind = getattr(importlib.import_module(module), name, None) if module.startswith("ropim.") else None
    return (kind if isinstance(kind, type) and issubclass(kind, ConfigError) else ConfigError)(record["message"])


def write_record(run_dir: str, name: str, record: dict) -> None:
    """``record`` as JSON in file ``name`` of the run's folder (a local path or a URI)."""
    fs, path = filesystem(f"{run_dir}/{name}")
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    write_whole(fs, path, json.dumps(record).encode())  # a kill leaves none or all of it: read at every start


def read_record(fs: pafs.FileSystem, path: str, remove: bool = False) -> dict | None:
    """The record in file ``path`` on ``fs`` (removed when ``remove``); None when there is none."""
    if fs.get_file_info(path).type.name == "NotFound":
        return None
    with fs.open_input_stream(path) as f:
        record = json.loads(f.read().decode())
    if remove:
        fs.delete_file(path)
    return record
