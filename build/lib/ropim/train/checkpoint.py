"""Training checkpoints: one folder per checkpoint, written whole. No Ray: the runtime hands folders to Ray Train.

A checkpoint folder holds ``model.safetensors`` (all weights), ``train_state.pt`` (optimizer, grad scaler,
epoch, step; tensors and plain values only, loaded with ``weights_only=True``), ``config.json`` (the job's
config) and ``metrics.json`` (the epoch's metrics). Random state needs no saving: sketches, shuffling,
augmentation and drop path are seeded from (seed, epoch or step, rank), so (epoch, step) determine the rest of
the run exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer, scaler, epoch: int, step: int,
                    config: dict) -> None:
    """Write a complete checkpoint into ``folder`` (a fresh temporary folder that the runtime then persists)."""
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
