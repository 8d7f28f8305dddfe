"""MLflow models-from-code definition of a registered ``ropim-classifier`` (loaded without pickle).

MLflow copies this file into each logged model, so it imports only torch, timm and safetensors.
``mlflow.pyfunc.load_model(uri).predict(images)`` maps normalized float32 images (B, C, H, W) to class
logits (B, K); ``config.json`` lists the class names, the image size and the normalization;
``.unwrap_python_model().model`` is the plain timm model (VisionTransformer or Beit).
"""

import json

import numpy as np
import timm
import torch
from mlflow.models import set_model
from mlflow.pyfunc import PythonModel
from safetensors.torch import load_file


class ClassifierModel(PythonModel):
    """A timm ViT classifier rebuilt from ``config.json`` and ``classifier.safetensors``."""

    def load_context(self, context) -> None:
        with open(context.artifacts["config"]) as f:
            self.config = json.load(f)
        self.model = timm.create_model(self.config["arch"], pretrained=False, **self.config["timm_kwargs"])
        self.model.load_state_dict(load_file(context.artifacts["weights"]))
        self.model.eval()

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        x = torch.as_tensor(np.asarray(model_input, dtype=np.float32))
        with torch.no_grad():
            return self.model(x).numpy()


set_model(ClassifierModel())
