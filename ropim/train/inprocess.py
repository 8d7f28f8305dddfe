"""The training loop in this process (``num_workers`` = 0): the ``Worker`` the loop sees, and where its checkpoints go.

Checkpoints go to ``<storage_path>/<run_name>/in_process/checkpoint_<epoch>``, the last ``keep_checkpoints`` kept
(Ray Train does the same for its own): in a local folder copied whole under a temporary name and renamed into place
(``LocalWorker``); on remote storage (``s3://…``, which cannot rename a folder) uploaded file by file, then marked
complete by an empty ``.complete`` file written last (``RemoteWorker``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import torch

from ropim.filesystems import filesystem
from ropim.train.checkpoint import ROOM, NoRoom, folder_bytes, full, size_text


class LocalWorker:
    """The loop in this process: checkpoints in ``folder``/checkpoint_<epoch>, the last ``keep`` kept, always written
    before ``report`` returns."""

    rank, world, local_world = 0, 1, 1

    def __init__(self, folder: Path, keep: int, use_gpu: bool = False) -> None:
        self.folder, self.keep = folder, keep
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.metrics: dict = {}

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (a folder is complete once renamed into place)."""
        return sorted(self.folder.glob("checkpoint_[0-9]*")) if self.folder.is_dir() else []

    def restorable(self) -> Iterator[tuple[str, contextlib.AbstractContextManager[str | Path]]]:
        """Complete checkpoints, newest first."""
        for path in reversed(self.checkpoints()):
            yield str(path), contextlib.nullcontext(str(path))

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        return values.unsqueeze(0)

    def gather_to_first(self, values: torch.Tensor) -> torch.Tensor | None:
        return values.unsqueeze(0)

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        return values.clone()

    def report(self, metrics: dict, folder: Path | None, background: bool = False) -> None:
        self.metrics = metrics
        if folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        dest = self.folder / f"checkpoint_{metrics['epoch']:06d}"
        tmp = self.folder / f".tmp_{dest.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            shutil.copytree(folder, tmp)
        except OSError as err:
            shutil.rmtree(tmp, ignore_errors=True)  # no half-written checkpoint left taking room
            if full(err):
                raise NoRoom(f"no space left in {self.folder} for epoch {metrics['epoch']}'s checkpoint "
                             f"({size_text(folder_bytes(folder))}): free space there, {ROOM}") from None
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
        for old in self.checkpoints()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)


class RemoteWorker(LocalWorker):
    """The loop in this process with its checkpoints on remote storage (``folder`` a URI such as ``s3://…``):
    uploaded whole, then marked complete (``COMPLETE``); the latest complete one downloaded to resume."""

    COMPLETE = ".complete"

    def __init__(self, folder: str, keep: int, use_gpu: bool = False) -> None:
        super().__init__(Path(), keep, use_gpu)
        self.folder = folder.rstrip("/")
        self.fs, self.root = filesystem(self.folder)

    def checkpoints(self) -> list[str]:
        """URIs of the complete checkpoints, oldest first."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        names = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory
                       and i.base_name.startswith("checkpoint_"))
        return [f"{self.folder}/{n}" for n in names
                if self.fs.get_file_info(f"{self.root}/{n}/{self.COMPLETE}").type == pafs.FileType.File]

    def restorable(self) -> Iterator[tuple[str, contextlib.AbstractContextManager[str | Path]]]:
        """Complete checkpoints, newest first, each downloaded when it is tried."""
        for uri in reversed(self.checkpoints()):
            yield uri, downloaded(uri)

    def report(self, metrics: dict, folder: Path | None, background: bool = False) -> None:
        self.metrics = metrics
        if folder is None:
            return
        dest = f"{self.root}/checkpoint_{metrics['epoch']:06d}"
        if self.fs.get_file_info(dest).type != pafs.FileType.NotFound:  # left by a job killed while uploading
            self.fs.delete_dir(dest)
        self.fs.create_dir(dest, recursive=True)
        try:
            pafs.copy_files(str(folder), dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        with self.fs.open_output_stream(f"{dest}/{self.COMPLETE}"):
            pass
        for old in self.checkpoints()[:-self.keep]:
            self.fs.delete_dir(filesystem(old)[1])


@contextlib.contextmanager
def downloaded(location: str) -> Iterator[Path]:
    """A checkpoint on remote storage as a temporary local folder."""
    fs, path = filesystem(location)
    with tempfile.TemporaryDirectory() as tmp:
        pafs.copy_files(path, tmp, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        yield Path(tmp)
