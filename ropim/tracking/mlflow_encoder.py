"""MLflow models-from-code definition of a registered ROPIM encoder (loaded without pickle).

MLflow copies this file into each logged model, so it imports only torch, timm and safetensors.
``mlflow.pyfunc.load_model(uri).predict(images)`` maps normalized float32 images (B, C, H, W) to
pooled features (B, D); ``.unwrap_python_model().encoder`` is the plain timm model (VisionTransformer or Beit).
"""

import json

import numpy as np
import timm
import torch
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel
from safetensors.torch import load_file


class EncoderModel(PythonModel):
    """A timm ViT rebuilt from ``config.json`` and ``encoder.safetensors``."""

    def load_context(self, context) -> None:
        with open(context.artifacts["config"]) as f:
            self.config = json.load(f)
        self.encoder = timm.create_model(self.config["arch"], pretrained=False, **self.config["timm_kwargs"])
        self.encoder.load_state_dict(load_file(context.artifacts["weights"]))
        self.encoder.eval()

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        x = torch.as_tensor(np.asarray(model_input, dtype=np.float32))
        with torch.no_grad():
            return self.encoder(x).numpy()


set_model(EncoderModel())
