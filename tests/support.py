"""What several test modules share: tiny configs, model and encoder builders, a runner for the ``ropim`` command in a
fresh process. (The shared fixtures are in ``conftest.py``.)"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from ropim.core.config import ModelConfig
from ropim.train.config import FinetuneConfig, PretrainConfig

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ModelConfig(img_size=32, patch_size=4, depth=1)  # 64 tokens, one block: seconds per epoch on a CPU
# a pretraining run of a few seconds: 3 steps of 16 images per epoch, pictures off
TINY_PRETRAIN = PretrainConfig(model=TINY_MODEL, epochs=2, global_batch_size=16, max_steps_per_epoch=3,
                               warmup_epochs=1, viz_every=0, log_every=100)
# a fine-tune of a few seconds: 2 steps of 16 images per epoch
TINY_FINETUNE = dict(epochs=2, batch_size=16, max_steps_per_epoch=2, warmup_epochs=0, log_every=1)


def tiny_pretrain(**changes) -> PretrainConfig:
    """``TINY_PRETRAIN`` with ``changes`` (``model`` may be a dict of ModelConfig changes)."""
    model = changes.pop("model", {})
    if isinstance(model, dict):
        model = dataclasses.replace(TINY_MODEL, **model)
    return dataclasses.replace(TINY_PRETRAIN, model=model, **changes)


def tiny_finetune(encoder: str, **changes) -> FinetuneConfig:
    return FinetuneConfig(encoder=encoder, **{**TINY_FINETUNE, **changes})


def encoder_folder(path: Path, model: ModelConfig = TINY_MODEL, seed: int = 0) -> Path:
    """A local encoder folder (encoder.safetensors + config.json), as registered encoders hold."""
    import torch
    from safetensors.torch import save_file

    from ropim.core.model import create_encoder
    from ropim.train.pretrain import encoder_config

    torch.manual_seed(seed)
    enc = create_encoder(model)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in enc.state_dict().items()}, str(path / "encoder.safetensors"))
    (path / "config.json").write_text(json.dumps(encoder_config(PretrainConfig(model=model), enc.embed_dim)))
    return path


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """``ropim ARGS`` in a fresh Python process."""
    return subprocess.run([sys.executable, "-m", "ropim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def register_tiny_encoder(workdir: Path) -> tuple[str, Path]:
    """A tiny encoder registered as ``ropim-encoder`` (alias 'champion' on version 1); also kept as a local folder."""
    from safetensors.torch import load_file

    from ropim.tracking import registry, store

    folder = encoder_folder(workdir / "enc-local")
    state, config = load_file(str(folder / "encoder.safetensors")), json.loads((folder / "config.json").read_text())
    run_id = store.create_run("ropim-pretrain", "tiny", PretrainConfig(model=TINY_MODEL).to_dict())
    uri = registry.register_encoder(run_id, state, config)
    store.end_run(run_id)
    store.client().set_registered_model_alias("ropim-encoder", "champion", uri.rsplit("/", 1)[1])
    return uri, folder


def gen(seed: int = 0):
    """A CPU torch generator seeded with ``seed``."""
    import torch

    return torch.Generator().manual_seed(seed)


def make_model(base: ModelConfig, **changes):
    """A ROPIM model of ``base`` with ``changes``, same initial weights every time, in eval mode."""
    import torch

    from ropim.core.model import ROPIM

    torch.manual_seed(0)
    return ROPIM(dataclasses.replace(base, **changes)).eval()


def write_ade20k(root: Path, n_train: int = 4, n_val: int = 2) -> Path:
    """An ADE20K-layout folder: 40x48 JPEGs, PNG label maps with 0 (ignore) and a few of the 150 classes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n, folder in (("training", n_train, "training"), ("validation", n_val, "validation")):
        (root / "images" / folder).mkdir(parents=True)
        (root / "annotations" / folder).mkdir(parents=True)
        for i in range(n):
            name = f"ADE_{split}_{i:08d}"
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "images" / folder /
                                                                                    f"{name}.jpg")
            mask = np.zeros((40, 48), np.uint8)
            mask[:20] = 3
            mask[20:, :24] = 150
            Image.fromarray(mask).save(root / "annotations" / folder / f"{name}.png")
    return root
