"""Registered segmenters: ``ropim-segmenter`` versions written pickle-free (``segmenter.safetensors`` + ``config.json``
in a models-from-code pyfunc, ``mlflow_segmenter.py``, with the model's own file ``ropim/core/upernet.py`` shipped
beside it) and read back as the torch model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ropim.core import upernet
from ropim.core.backbone import load_weights
from ropim.tracking import registry, store
from ropim.tracking.names import DEFAULT_SEGMENTER_NAME

if TYPE_CHECKING:
    import torch

SEGMENTER_CODE = Path(__file__).with_name("mlflow_segmenter.py")
UPERNET_FILE = Path(upernet.__file__)
SEGMENTER_REQUIREMENTS = (*registry.ENCODER_REQUIREMENTS, *store.requirements("segmentation-models-pytorch"))


def register_segmenter(run_id: str, state: dict[str, torch.Tensor], config: dict, name: str = DEFAULT_SEGMENTER_NAME,
                       uri: str | None = None) -> str:
    """Log the segmenter on ``run_id`` and register a new version of ``name``; return its ``models:/`` URI."""
    return registry.register_model(run_id, state, {**config, "kind": "segmenter"}, name, uri, kind="segmenter",
                                   code=SEGMENTER_CODE, code_paths=(UPERNET_FILE,),
                                   requirements=SEGMENTER_REQUIREMENTS)


def load_segmenter(model_uri: str, uri: str | None = None):
    """A registered segmenter as its torch model (``ropim.core.upernet.UperNetViT``, eval mode) and its config."""
    state, config = registry.load_model_files(model_uri, uri, "segmenter")
    model = upernet.build_segmenter(config)
    load_weights(model, state, f"segmenter {model_uri}")
    return model.eval(), config
