"""The speed options on CPU: each one's code path runs (compile traced as one graph per step, channels_last, TF32
setting, AdamW kernels, pinned copies) and a pretraining and a fine-tune with all of them on finish as usual."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from support import encoder_folder, tiny_finetune, tiny_pretrain
from timm.optim import create_optimizer_v2

from ropim.errors import ConfigError
from ropim.tracking import store
from ropim.train.driver import run
from ropim.train.speed import adamw_kernels, images_to, side_stream, tf32_matmuls

FAST = dict(compile=True, channels_last=True, tf32=True, adamw="fused", pin_memory=True)


@pytest.fixture
def compiled(monkeypatch):
    """torch.compile as the loop calls it, traced with fullgraph=True (a graph break fails the step) and run by
    AOTAutograd without inductor's C++ build; returns the modules it compiled."""
    seen, compile_ = [], torch.compile

    def traced(model, **kwargs):
        seen.append(model)
        return compile_(model, backend="aot_eager", fullgraph=True, **kwargs)

    monkeypatch.setattr(torch, "compile", traced)
    yield seen
    torch._dynamo.reset()


@pytest.mark.parametrize("kind,flags", [("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})])
def test_adamw_kernels_reach_the_optimizer(kind, flags):
    model = torch.nn.Linear(4, 2)
    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, **adamw_kernels(kind))
    for name in ("foreach", "fused"):
        assert opt.defaults[name] == flags.get(name, None), name
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # every kernel runs on CPU too


def test_images_to_and_tf32():
    x = torch.randn(2, 3, 8, 8)
    assert images_to(x, torch.device("cpu"), channels_last=True).is_contiguous(memory_format=torch.channels_last)
    assert images_to(x, torch.device("cpu")).is_contiguous()
    before = torch.get_float32_matmul_precision()
    with tf32_matmuls(True):
        assert torch.get_float32_matmul_precision() == "high"
    with tf32_matmuls(False):
        assert torch.get_float32_matmul_precision() == before
    assert torch.get_float32_matmul_precision() == before


def test_bad_speed_options_are_refused():
    with pytest.raises(ConfigError, match="adamw='apex'"):
        tiny_pretrain(adamw="apex").validate()
    with pytest.raises(ConfigError, match="compile='yes'"):
        tiny_finetune("x", compile="yes").validate()


def test_pretrain_and_finetune_with_every_speed_option(workdir, compiled):
    result = run(tiny_pretrain(run_name="fast", num_workers=0, epochs=1, max_steps_per_epoch=2, **FAST))
    assert result.metrics["step"] == 2 and result.model_uri is not None
    assert len(compiled) == 1 and type(compiled[0]).__name__ == "ROPIM"  # the model the loss calls
    assert [m.step for m in store.client().get_metric_history(result.run_id, "loss")] == [1]

    enc = str(encoder_folder(workdir / "enc"))
    out = run(tiny_finetune(enc, num_workers=0, epochs=1, registered_model="", run_name="ft-fast", **FAST)).metrics
    assert out["step"] == 2 and 0 <= out["top1"] <= 100
    assert len(compiled) == 2


@pytest.mark.parametrize(("native", "device", "expected"), [(True, "cpu", "bf16"), (False, "cpu", "fp32"),
                                                             (True, "cuda", "fp32")])
def test_auto_precision_follows_the_cpu(monkeypatch, native, device, expected):
    """``auto`` is bf16 only on a CPU with native bf16 instructions; an explicit precision is kept as it is."""
    from ropim.train import speed

    monkeypatch.setattr(speed, "cpu_features", lambda: {"native_bf16": native})
    assert speed.resolve_precision("auto", torch.device(device)) == expected
    assert speed.resolve_precision("fp32", torch.device(device)) == "fp32"
    assert speed.resolve_precision("bf16", torch.device(device)) == "bf16"


def test_cpu_features_reads_this_machine():
    from ropim.train.speed import cpu_features

    found = cpu_features()
    assert isinstance(found["model"], str) and found["model"]
    assert found["native_bf16"] == (found["avx512_bf16"] or found["amx_bf16"])


# One process, one rank of DDP over gloo: UperNet's decoder (1×1 convolutions) steps under bf16 autocast with its
# weights' gradients in their weights' strides (the loop's grads_in_weight_strides), then a copy of it without. DDP
# warns once per process, so the hooked model goes first.
DDP_STRIDES = r"""
import os, sys, warnings
import timm, torch, torch.distributed as dist
from ropim.core.upernet import UperNetViT
from ropim.train.speed import grads_in_weight_strides

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
warned = []
for hooked in (True, False):
    encoder = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, depth=2, num_classes=0)
    model = UperNetViT(encoder, 5, channels=32, aux_channels=16)
    if hooked:
        grads_in_weight_strides(model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits, aux = ddp(torch.randn(2, 3, 64, 64))
            (logits.float().mean() + aux.float().mean()).backward()
            model.zero_grad(set_to_none=True)
    warned.append(any("Grad strides do not match bucket view strides" in str(w.message) for w in seen))
print(warned)
"""


def test_ddp_sees_1x1_convolution_gradients_in_their_weights_strides(tmp_path):
    out = subprocess.run([sys.executable, "-c", DDP_STRIDES, str(tmp_path / "rendezvous")], capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.strip() == "[False, True]", out.stderr[-3000:]  # the warning segmentation printed per worker


def test_a_side_stream_starts_after_the_work_training_queued(monkeypatch):
    """An evaluation beside training reads a copy of the weights that training's stream is still writing; its own
    stream must wait for it (before: a new stream, unordered, could read a half-copied encoder). CUDA streams are
    stood in for, so the order is checked on a CPU."""
    calls = []

    class Stream:
        def __init__(self, device) -> None:
            calls.append(("new stream", str(device)))

        def wait_stream(self, other) -> None:
            calls.append(("waits for", other))

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: f"the calling thread's stream on {device}")
    assert side_stream(torch.device("cpu")) is None and calls == []
    assert isinstance(side_stream(torch.device("cuda", 1)), Stream)
    assert calls == [("new stream", "cuda:1"), ("waits for", "the calling thread's stream on cuda:1")]
