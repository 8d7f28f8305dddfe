"""MLflow models-from-code definition of a registered ``ropim-segmenter`` (loaded without pickle).

MLflow copies this file into each logged model, with ``upernet.py`` (``ropim/core/upernet.py``) beside it as a code
path, so it needs torch, timm, safetensors and segmentation_models_pytorch, not ropim.
``mlflow.pyfunc.load_model(uri).predict(images)`` maps normalized float32 images (B, C, H, W) (H, W: the crop size)
to class logits (B, K, H, W); ``config.json`` holds the class names and the normalization;
``.unwrap_python_model().model`` is the torch model.
"""

import json

import numpy as np
import torch
import torch.nn.functional as F
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel
from safetensors.torch import load_file

try:
    from upernet import build_segmenter  # the code path shipped with the model
except ImportError:  # logging it, in a process that has ropim
    from ropim.core.upernet import build_segmenter


class SegmenterModel(PythonModel):
    """UperNet on a timm ViT, rebuilt from ``config.json`` and ``segmenter.safetensors``."""

    def load_context(self, context) -> None:
        with open(context.artifacts["config"]) as f:
            self.config = json.load(f)
        self.model = build_segmenter(self.config)
        self.model.load_state_dict(load_file(context.artifacts["weights"]))
        self.model.eval()

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        x = torch.as_tensor(np.asarray(model_input, dtype=np.float32))
        with torch.no_grad():
            logits = self.model(x)
            return F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False).numpy()


set_model(SegmenterModel())
