"""A named run's metadata file (``<storage_path>/<name>/ropim_run.json``: its MLflow run id, config and outcome),
read and written whole. Needs pyarrow, not MLflow: the pre-flight reads it before anything heavy starts."""

from __future__ import annotations

import json

import pyarrow.fs as pafs

from ropim.filesystems import filesystem

RUN_META = "ropim_run.json"
IN_PROCESS = "in_process"  # the run's sub-folder of the in-process loop's checkpoints (``ropim.train.inprocess``)


def read_run_meta(storage_path: str, name: str) -> dict | None:
    """The metadata of run ``name`` under ``storage_path``, or None for a new run."""
    fs, root = filesystem(storage_path)
    path = f"{root}/{name}/{RUN_META}"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode())


def write_run_meta(storage_path: str, name: str, meta: dict) -> None:
    """Write the run metadata whole (a temporary file, then a rename)."""
    fs, root = filesystem(storage_path)
    fs.create_dir(f"{root}/{name}", recursive=True)
    path = f"{root}/{name}/{RUN_META}"
    with fs.open_output_stream(path + ".tmp") as f:
        f.write(json.dumps(meta, indent=2).encode())
    fs.move(path + ".tmp", path)


def checkpoint_histories(storage_path: str, name: str) -> tuple[bool, bool]:
    """(whether run ``name`` holds checkpoints of Ray Train workers, of the loop in this process): Ray Train keeps
    its own in the run's folder, the in-process loop in its ``IN_PROCESS`` sub-folder."""
    fs, root = filesystem(storage_path)

    def holds(folder: str) -> bool:
        infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
        return any(i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_") for i in infos)

    return holds(f"{root}/{name}"), holds(f"{root}/{name}/{IN_PROCESS}")
