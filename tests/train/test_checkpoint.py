"""Checkpoints written on a GPU load where the run continues: a job resumed on CPUs (``use_gpu`` changed), or a
worker whose GPU is not the one that saved, gets the optimizer state on the CPU first (the optimizer then moves it to
its parameters' device), not on ``cuda:0``. And the local folders checkpoints are written in before Ray uploads
them do not pile up after killed workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import torch

from ropim.train.checkpoint import SCRATCH, load_checkpoint, save_checkpoint, scratch_folder

SAVING_ON_A_GPU = [False]  # set while the test writes a checkpoint, so that the tagger below is inert otherwise


def as_if_on_cuda0(storage) -> str | None:
    """torch.save's location tag of every storage while ``SAVING_ON_A_GPU``: what a checkpoint saved on a GPU holds."""
    return "cuda:0" if SAVING_ON_A_GPU[0] else None


def no_deserializer(storage, location: str):
    return None  # torch's own ones restore every location


torch.serialization.register_package(1, as_if_on_cuda0, no_deserializer)


def trained_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_a_checkpoint_saved_on_a_gpu_resumes_on_cpus(tmp_path):
    model, opt = trained_model()
    SAVING_ON_A_GPU[0] = True
    try:
        save_checkpoint(tmp_path, model, opt, None, epoch=4, step=40, config={"kind": "toy"})
    finally:
        SAVING_ON_A_GPU[0] = False
    fresh = torch.nn.Linear(4, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    state = load_checkpoint(tmp_path, fresh, fresh_opt)  # before: "Attempting to deserialize object on a CUDA device"
    assert (state["epoch"], state["step"]) == (4, 40)
    moments = [s["exp_avg"] for s in fresh_opt.state_dict()["state"].values()]
    assert all(m.device.type == "cpu" for m in moments)
    saved = [s["exp_avg"] for s in opt.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(saved, moments, strict=True))


def test_a_killed_workers_checkpoint_folder_is_removed_by_the_next_one_on_its_host(tmp_path, monkeypatch):
    """A worker SIGKILLed (or OOM-killed) while Ray uploads its checkpoint leaves the folder, ~1 GB at ViT-B, in the
    temporary folder; the next checkpoint written on that host removes it, and no folder of a live process or of
    another host sharing the folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = [tmp_path / f"{SCRATCH}{host}-{int(dead.stdout)}-x1", tmp_path / f"{SCRATCH}{host}-{os.getppid()}-x2",
            tmp_path / f"{SCRATCH}other-host-{int(dead.stdout)}-x3",
            tmp_path / f"{SCRATCH}{host}-17-{int(dead.stdout)}-x4"]  # host "<this host>-17" sharing the folder
    for folder in left:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"0" * 1024)
    new = scratch_folder()
    assert new.parent == tmp_path and new.name.startswith(f"{SCRATCH}{host}-{os.getpid()}-")
    assert [f.exists() for f in left] == [False, True, True, True]
