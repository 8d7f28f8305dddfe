"""Training checkpoints and run metadata. No Ray: the trainer hands folders to Ray Train.

A checkpoint folder holds ``model.safetensors`` (all weights), ``train_state.pt`` (optimizer, grad scaler,
epoch, step; tensors and plain values only, loaded with ``weights_only=True``) and ``config.json``.
Random state needs no saving: sketches, shuffling, augmentation and drop path are seeded from
(seed, epoch or step, rank), so (epoch, step) determine the rest of the run exactly.

Beside the checkpoints, ``<storage_path>/<run_name>/ropim_run.json`` records the MLflow run id and the config
so that re-running (or ``--resume``-ing) a named run continues the same MLflow run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import torch
from safetensors.torch import load_file, save_file

RUN_META = "ropim_run.json"


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer, scaler, epoch: int, step: int,
                    config: dict) -> None:
    """Write a complete checkpoint into ``folder`` (a fresh temporary folder that Ray Train then persists)."""
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    state = {"optimizer": optimizer.state_dict(), "epoch": epoch, "step": step,
             "scaler": scaler.state_dict() if scaler is not None else {}}
    torch.save(state, folder / "train_state.pt")
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def load_checkpoint(folder: str | Path, model: torch.nn.Module, optimizer=None, scaler=None) -> dict:
    """Load weights (and optimizer / scaler state when given) from ``folder``; return the train state."""
    folder = Path(folder)
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    state = torch.load(folder / "train_state.pt", weights_only=True)
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    return state


def _fs(storage_path: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) for a local folder or any URI pyarrow understands (s3://, gs://, …)."""
    if "://" in storage_path:
        return pafs.FileSystem.from_uri(storage_path)
    return pafs.LocalFileSystem(), str(Path(storage_path).absolute())


def read_run_meta(storage_path: str, run_name: str) -> dict | None:
    """The metadata of run ``run_name`` under ``storage_path``, or None for a new run."""
    fs, root = _fs(storage_path)
    path = f"{root}/{run_name}/{RUN_META}"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def write_run_meta(storage_path: str, run_name: str, meta: dict) -> None:
    """Write the run metadata atomically on local disk (write, then rename)."""
    fs, root = _fs(storage_path)
    fs.create_dir(f"{root}/{run_name}", recursive=True)
    path = f"{root}/{run_name}/{RUN_META}"
    with fs.open_output_stream(path + ".tmp") as f:
        f.write(json.dumps(meta, indent=2).encode())
    fs.move(path + ".tmp", path)

