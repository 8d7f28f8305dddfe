"""Training checkpoints: one folder per checkpoint, written whole. No Ray: the runtime hands folders to Ray Train.

A checkpoint folder holds ``model.safetensors`` (all weights), ``train_state.pt`` (optimizer, grad scaler,
epoch, step; tensors and plain values only, loaded with ``weights_only=True``), ``config.json`` (the job's
config) and ``metrics.json`` (the epoch's metrics). Random state needs no saving: sketches, shuffling,
augmentation and drop path are seeded from (seed, epoch or step, rank), so (epoch, step) determine the rest of
the run exactly.

Ray Train lists a run's committed checkpoints in ``<run folder>/checkpoint_manager_snapshot.json`` and will not start
when a folder it lists is gone; ``forget_missing`` drops those entries first, so the run continues from the newest
checkpoint left (as ``restore`` passes over one that cannot be loaded).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path

import pyarrow.fs as pafs
import torch
from safetensors.torch import load_file, save_file

from ropim.errors import ConfigError
from ropim.tracking.storage import storage_fs

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's list of a run's checkpoints (ray 2.60's format)

Candidates = Iterable[tuple[str, contextlib.AbstractContextManager[str | Path]]]  # (name, a local folder), newest first


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


def restore(candidates: Candidates, model: torch.nn.Module, optimizer=None,
            scaler=None) -> tuple[dict | None, list[str]]:
    """Load the newest of ``candidates`` that loads (a later one fully overwrites what an unreadable one half-loaded);
    return (its train state, or None on a fresh run; the checkpoints that could not be loaded, as "name (why)").
    ConfigError when there were checkpoints and none loads."""
    unreadable = []
    for name, folder in candidates:
        with folder as local:
            try:
                return load_checkpoint(local, model, optimizer, scaler), unreadable
            except Exception as err:  # noqa: BLE001 — cut short, not safetensors, not a checkpoint: try the previous
                why = (str(err).strip().splitlines() or [type(err).__name__])[0]
                unreadable.append(f"{name} ({why[:200]})")
    if unreadable:
        raise ConfigError(f"no checkpoint of this run can be loaded: {'; '.join(unreadable)}; move them away to "
                          "start the run over, or give a new run_name")
    return None, unreadable


def forget_missing(run_dir: str) -> list[str]:
    """Drop from Ray Train's snapshot of the run in ``run_dir`` (a folder or URI) the checkpoints whose folders are
    gone (deleted by hand, lost with a disk), saying so in one line; the run then continues from the newest one left.
    Return their names. ConfigError when every checkpoint it lists is gone. Nothing to do without a snapshot (a new
    run, or one in this process)."""
    fs, root = storage_fs(run_dir)
    path = f"{root}/{SNAPSHOT}"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    with fs.open_input_stream(path) as f:
        state = json.loads(f.read().decode())
    results = list(zip(state["checkpoint_results"], state["checkpoint_report_indices"], strict=True))
    missing = [r["checkpoint_dir_name"] for r, _ in results
               if fs.get_file_info(f"{root}/{r['checkpoint_dir_name']}").type == pafs.FileType.NotFound]
    if not missing:
        return []
    kept = [(r, i) for r, i in results if r["checkpoint_dir_name"] not in missing]
    if not kept:
        raise ConfigError(f"no checkpoint of this run is left: {', '.join(missing)} missing from {run_dir}; move the "
                          "run's folder away to start it over, or give a new run_name")
    latest = max(kept, key=lambda k: k[1])[0]
    state["checkpoint_results"], state["checkpoint_report_indices"] = [r for r, _ in kept], [i for _, i in kept]
    if (state.get("latest_checkpoint_result") or {}).get("checkpoint_dir_name") in missing:
        state["latest_checkpoint_result"] = latest
    pending = [(r, v) for r, v in zip(state["pending_training_results"], state["pending_validation_specs"],
                                      strict=True) if r["checkpoint_dir_name"] not in missing]
    state["pending_training_results"] = [r for r, _ in pending]
    state["pending_validation_specs"] = [v for _, v in pending]
    for key in ("validated_checkpoint_dir_names", "timed_out_validation_checkpoint_dir_names",
                "failed_validation_checkpoint_dir_names"):
        state[key] = [name for name in state.get(key, []) if name not in missing]
    with fs.open_output_stream(path) as f:
        f.write(json.dumps(state).encode())
    print(f"{run_dir}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing; the run continues from "
          f"{latest['checkpoint_dir_name']}, the newest checkpoint left", flush=True)
    return missing
