"""A disk that fills during a long run: the first checkpoint a job writes checks the room its checkpoints need (one
warning line when the disk lacks it); a checkpoint that does not fit ends the job in one line saying where, what
frees room and how to continue, leaves nothing half-written, and the same job continues from the last complete one."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from support import tiny_pretrain

from ropim.train import checkpoint, inprocess, loop
from ropim.train.checkpoint import NoRoom
from ropim.train.driver import run

FULL = OSError(errno.ENOSPC, "No space left on device")


def test_a_checkpoint_the_temporary_folder_cannot_hold_ends_the_job_in_one_line(workdir, monkeypatch, tmp_path):
    cfg = tiny_pretrain(run_name="tmp-full", num_workers=0, epochs=3, max_steps_per_epoch=1)
    save = checkpoint.save_checkpoint
    monkeypatch.setattr(checkpoint.tempfile, "tempdir", str(tmp_path))  # the loop's temporary folders, to count them

    def saving(folder, model, optimizer, scaler, epoch, *args):
        if epoch == 1:
            (folder / "model.safetensors").write_bytes(b"half")
            raise FULL
        save(folder, model, optimizer, scaler, epoch, *args)

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "save_checkpoint", saving)
        with pytest.raises(NoRoom) as err:
            run(cfg)
    assert str(err.value) == (f"run tmp-full: no space left in {tmp_path} (the temporary folder) for epoch 2's "
                              "checkpoint: free space there, or set TMPDIR to a larger disk; its complete "
                              f"checkpoints are kept in {workdir}/ray_results/tmp-full: then continue with `ropim "
                              "pretrain --resume tmp-full`")
    assert not list(tmp_path.glob("ropim-checkpoint-*"))  # nothing half-written left taking room
    assert run(cfg).metrics["epoch"] == 3


def test_a_checkpoint_the_storage_cannot_hold_leaves_nothing_half_written(workdir, monkeypatch, caplog):
    cfg = tiny_pretrain(run_name="storage-full", num_workers=0, epochs=3, max_steps_per_epoch=1)
    copytree = shutil.copytree

    def copying(src, dst, *args, **kwargs):
        if Path(dst).name.endswith("02"):
            Path(dst).mkdir()
            (Path(dst) / "model.safetensors").write_bytes(b"half")
            raise FULL
        return copytree(src, dst, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(inprocess.shutil, "copytree", copying)
        with pytest.raises(NoRoom, match=r"^run storage-full: no space left in .*storage-full/in_process for epoch "
                                         r"2's checkpoint \(\d+ [kM]B\): free space there, lower --keep_checkpoints or "
                                         r"give another --storage_path; its complete checkpoints are kept in .*/"
                                         r"storage-full: then continue with `ropim pretrain --resume storage-full`$"):
            run(cfg)
    stored = sorted(p.name for p in (workdir / "ray_results" / "storage-full" / "in_process").iterdir())
    assert stored == ["checkpoint_000001"]  # before: a half-written .tmp_checkpoint_000002 was left
    caplog.set_level("INFO", logger="ropim.train")
    assert run(cfg).metrics["epoch"] == 3 and "resumed from epoch 1" in caplog.text


def test_the_first_checkpoint_says_when_the_disk_lacks_room_for_the_run(workdir, monkeypatch, caplog):
    """keep_checkpoints 2, and the next one written before the oldest is dropped: 3 checkpoints' room."""
    usage = namedtuple("usage", "total used free")
    disk_usage = shutil.disk_usage
    sizes: list[int] = []
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(1, 1, 2 * sizes[-1]) if sizes
                        else disk_usage(p))
    folder_bytes = checkpoint.folder_bytes
    monkeypatch.setattr(loop, "folder_bytes", lambda f: sizes.append(folder_bytes(f)) or sizes[-1])
    caplog.set_level("INFO", logger="ropim.train")
    run(tiny_pretrain(run_name="tight", num_workers=0, epochs=2, max_steps_per_epoch=1))
    said = [r.getMessage() for r in caplog.records if "B free: " in r.getMessage()]
    assert len(said) == 1 and len(sizes) == 1, said  # once, at the job's first checkpoint
    assert "B free: this run keeps 2 checkpoint(s) of " in said[0] and "lower --keep_checkpoints" in said[0]
    caplog.clear()
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(1, 1, 3 * sizes[-1]))
    run(tiny_pretrain(run_name="roomy", num_workers=0, epochs=1, max_steps_per_epoch=1))
    assert not [r for r in caplog.records if "B free: " in r.getMessage()]


class ControllerError(Exception):
    """As Ray Train's: its controller's own failure, wrapped (``controller_failure``)."""

    __module__ = "ray.train.v2.api.exceptions"

    def __init__(self, inner: BaseException) -> None:
        super().__init__(f"Training failed due to controller error:\n{inner}")
        self.controller_failure = inner


def test_ray_trains_controller_writing_to_a_full_storage_path_is_the_no_room_line(workdir, monkeypatch):
    """With ``--async_checkpoint true`` the disk fills while Ray uploads: Ray Train's controller then fails writing
    the run's state (seen on a 40 MB tmpfs). Before, the line said the controller failed and to continue, as after a
    memory kill: continuing without freeing space fails the same way."""
    from ropim.train import driver

    detail = OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
    monkeypatch.setattr(driver, "fit", lambda *a, **k: (_ for _ in ()).throw(ControllerError(detail)))
    cfg = tiny_pretrain(run_name="controller-full", num_workers=0, epochs=1, max_steps_per_epoch=1)
    with pytest.raises(NoRoom) as err:
        driver.run(cfg)
    assert str(err.value) == (
        "run controller-full: a disk the run writes to is full ([Errno 28] Error writing bytes to file. Detail: "
        "[errno 28] No space left on device): free space in its storage_path or the temporary folder, lower "
        "--keep_checkpoints or give another --storage_path; its complete checkpoints are kept in "
        f"{workdir}/ray_results/controller-full: then continue with `ropim pretrain --resume controller-full`")
