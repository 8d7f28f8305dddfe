"""Checkpoints written on a GPU load where the run continues: a job resumed on CPUs (``use_gpu`` changed), or a
worker whose GPU is not the one that saved, gets the optimizer state on the CPU first (the optimizer then moves it to
its parameters' device), not on ``cuda:0``."""

from __future__ import annotations

import torch

from ropim.train.checkpoint import load_checkpoint, save_checkpoint

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
