"""Encoder references: a URI resolved once, on the driver, to the weights every worker loads.

An encoder URI is ``models:/name/version``, ``models:/name@alias``, ``runs:/<run_id>/<path>`` or a local folder
holding ``encoder.safetensors`` + ``config.json``. Aliases are pinned to the version they point at, so every
worker (and a resumed run) loads the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ropim.errors import ConfigError
from ropim.tracking import registry


@dataclass(frozen=True)
class EncoderRef:
    """An encoder resolved on the driver: ``pinned`` is what workers load (an alias replaced by its version)."""

    uri: str
    pinned: str
    name: str | None
    version: str | None
    config: dict
    depth: int  # blocks in its weights

    @property
    def label(self) -> str:
        """``name v3`` for registered encoders, else the URI."""
        return f"{self.name} v{self.version}" if self.version else self.uri


def resolve_encoder(model_uri: str, tracking: str | None = None) -> tuple[EncoderRef, dict[str, torch.Tensor]]:
    """Resolve ``model_uri`` (one clear error naming it when it is wrong) and load its weights and config."""
    version = registry.resolve_version(model_uri, tracking)
    pinned = f"models:/{version[0]}/{version[1]}" if version else model_uri
    if version is None and Path(model_uri).expanduser().exists():
        pinned = str(Path(model_uri).expanduser().absolute())  # workers may run in another cwd
    state, config = registry.load_encoder_files(pinned, tracking)
    missing = {"arch", "timm_kwargs", "img_size", "patch_size"} - set(config)
    if missing:
        raise ConfigError(f"encoder {model_uri}: config.json lacks {', '.join(sorted(missing))}; "
                          "is it a ropim encoder?")
    return EncoderRef(model_uri, pinned, *(version or (None, None)), config, encoder_depth(state)), state


def encoder_depth(state: dict[str, torch.Tensor]) -> int:
    """The number of blocks of an encoder state dict."""
    return 1 + max((int(k.split(".")[1]) for k in state if k.startswith("blocks.")), default=-1)
