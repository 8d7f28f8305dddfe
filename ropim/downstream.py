"""What fine-tune, probe and transfer share: resolving and checking an encoder against the data, building a
timm model from it at any image size (position embedding resampled), scoring, and logging results to MLflow.

An encoder URI is ``models:/name/version``, ``models:/name@alias``, ``runs:/<run_id>/<path>`` or a local folder
holding ``encoder.safetensors`` + ``config.json``. Aliases are resolved once, on the driver, to the version they
point at, so every worker (and a resumed run) loads the same weights.
"""

from __future__ import annotations

import json
import logging
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import timm
import torch
from timm.layers import resample_abs_pos_embed

from ropim import registry
from ropim.data import DataConfig, build_dataset, eval_transform
from ropim.errors import ConfigError

log = logging.getLogger("ropim.downstream")


def ensure_logging() -> None:
    """Show ``ropim.*`` INFO lines (progress, resampling) on stderr when nothing else configured logging."""
    logger = logging.getLogger("ropim")
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)


@dataclass(frozen=True)
class EncoderRef:
    """An encoder resolved on the driver: ``pinned`` is what workers load (an alias replaced by its version)."""

    uri: str
    pinned: str
    name: str | None
    version: str | None
    config: dict

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
    return EncoderRef(model_uri, pinned, *(version or (None, None)), config), state


def resolved_data(data: DataConfig) -> DataConfig:
    """``data`` with a relative local path made absolute when the DataConfig supports it (Ray workers)."""
    return data.resolved() if hasattr(data, "resolved") else data


def check_image_size(ref: EncoderRef, img_size: int) -> None:
    """The encoder's patch size must divide the image size it is used at."""
    p = ref.config["patch_size"]
    if img_size <= 0 or img_size % p:
        raise ConfigError(f"img_size={img_size}: encoder {ref.uri} has patch size {p}, which must divide the image "
                          f"size (e.g. img_size={max(p, img_size - img_size % p)})")


def check_channels(ref: EncoderRef, dataset, data: DataConfig) -> None:
    """Fail, naming both, when the encoder's input channels differ from what the data gives."""
    expected = ref.config.get("in_chans", ref.config["timm_kwargs"].get("in_chans", 3))
    if len(dataset) == 0:
        raise ConfigError(f"data source={data.source!r}: the split holds no images")
    got = dataset[0][0].shape[0]
    if got != expected:
        raise ConfigError(f"encoder {ref.uri} expects {expected}-channel images (in_chans={expected}) but data "
                          f"source={data.source!r} gives {got}-channel images; use an encoder pretrained on "
                          f"{got}-channel data")


def eval_split(ref: EncoderRef, data: DataConfig, img_size: int, split: str = "val"):
    """``split`` of ``data`` under the eval transform, after checking image size and channels against ``ref``."""
    check_image_size(ref, img_size)
    dataset = build_dataset(data, split, eval_transform(img_size), img_size)
    check_channels(ref, dataset, data)
    return dataset


def dataset_name(data: DataConfig) -> str:
    """A short name of the data for tags and tables: 'digits', or the last part of a path / URI."""
    name = getattr(data, "name", None) or data.source.rstrip("/").split("?")[0].rsplit("/", 1)[-1]
    name = re.sub(r"\.(parquet|tar|zip)$", "", name)
    return re.sub(r"[^A-Za-z0-9_\-]+", "_", name).strip("_") or "data"


def build_model(config: dict, state: dict[str, torch.Tensor] | None, num_classes: int, img_size: int | None = None,
                drop_path: float = 0.0, uri: str = "encoder", quiet: bool = False) -> timm.models.VisionTransformer:
    """A timm ViT with the encoder's architecture, ``num_classes`` outputs (0: pooled features) at ``img_size``,
    loaded from ``state`` (None: random init). A different image size resamples the position embedding."""
    src = config["img_size"]
    img_size = img_size or src
    kwargs = {**config["timm_kwargs"], "img_size": img_size, "num_classes": num_classes, "drop_path_rate": drop_path}
    model = timm.create_model(config["arch"], pretrained=False, **kwargs)
    if state is None:
        return model
    state = dict(state)
    pos = state.get("pos_embed")
    if pos is not None and pos.shape != model.pos_embed.shape:
        p = config["patch_size"]
        old, new = (src // p, src // p), tuple(model.patch_embed.grid_size)
        prefix = 0 if getattr(model, "no_embed_class", False) else model.num_prefix_tokens
        state["pos_embed"] = resample_abs_pos_embed(pos, new_size=list(new), old_size=list(old),
                                                    num_prefix_tokens=prefix)
        if not quiet:
            log.info(f"[downstream] encoder {uri} was pretrained at {src}x{src}, used at {img_size}x{img_size}: "
                     f"position embedding resampled from a {old[0]}x{old[1]} to a {new[0]}x{new[1]} grid "
                     "(timm resample_abs_pos_embed, bicubic)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("head.") for k in missing):
        raise ConfigError(f"encoder {uri}: weights do not match {config['arch']} ({missing=}, {unexpected=})")
    return model


def classifier_config(ref: EncoderRef, classes: list[str], img_size: int, dataset: str, metrics: dict) -> dict:
    """The JSON config stored beside a registered classifier (scalar entries become version tags)."""
    from ropim.data import IMAGENET_MEAN, IMAGENET_STD

    kwargs = {**ref.config["timm_kwargs"], "img_size": img_size, "num_classes": len(classes), "drop_path_rate": 0.0}
    return {
        "arch": ref.config["arch"], "timm_kwargs": kwargs, "img_size": img_size,
        "patch_size": ref.config["patch_size"], "num_classes": len(classes), "classes": list(classes),
        "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "dataset": dataset,
        "encoder_uri": ref.pinned, "encoder_name": ref.name or "", "encoder_version": ref.version or "",
        "top1": round(metrics["top1"], 4), "top5": round(metrics["top5"], 4), "embed_dim": ref.config.get("embed_dim"),
    }


# ----------------------------------------------------------------------------------------------- scores


def confusion_matrix(pred: torch.Tensor, target: torch.Tensor, n_classes: int) -> torch.Tensor:
    """(K, K) int64 counts, rows = true class, columns = predicted class."""
    idx = target.long().cpu() * n_classes + pred.long().cpu()
    return torch.bincount(idx, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def topk_hits(scores: torch.Tensor, target: torch.Tensor, k: int = 5) -> tuple[int, int]:
    """(top-1 hits, top-k hits) of class scores (N, K) against labels (N,)."""
    top = scores.topk(min(k, scores.shape[1]), dim=1).indices
    target = target.to(top.device)
    return int((top[:, 0] == target).sum()), int((top == target[:, None]).any(1).sum())


def topk_accuracy(scores: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    """Top-1 and top-5 accuracy (%) of class scores (N, K)."""
    h1, h5 = topk_hits(scores, target)
    return {"top1": 100 * h1 / len(target), "top5": 100 * h5 / len(target)}


def per_class_accuracy(confusion: torch.Tensor) -> list[float]:
    """Recall (%) of each class; NaN for classes absent from the split."""
    conf = torch.as_tensor(confusion, dtype=torch.float64)
    return (100 * conf.diag() / conf.sum(1)).tolist()


def confusion_png(confusion, classes: list[str], path: Path, title: str) -> None:
    """A confusion-matrix heat map (rows normalised to recall) as a PNG."""
    from matplotlib.figure import Figure

    conf = torch.as_tensor(confusion, dtype=torch.float64)
    norm = conf / conf.sum(1, keepdim=True).clamp(min=1)
    k = len(classes)
    side = min(4 + 0.35 * k, 14)
    fig = Figure(figsize=(side + 1.5, side))
    ax = fig.add_subplot()
    im = ax.imshow(norm.numpy(), cmap="viridis", vmin=0, vmax=1)
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of true class")
    if k <= 30:
        ax.set_xticks(range(k), classes, rotation=90, fontsize=8)
        ax.set_yticks(range(k), classes, fontsize=8)
        if k <= 15:
            for i in range(k):
                for j in range(k):
                    if conf[i, j]:
                        ax.text(j, i, int(conf[i, j]), ha="center", va="center", fontsize=7,
                                color="black" if norm[i, j] > 0.5 else "white")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def log_results(run_id: str, confusion, classes: list[str], tracking: str, *, prefix: str = "", step: int | None = None,
                title: str = "") -> dict:
    """Log per-class accuracy metrics (``<prefix>class_acc.<class>``), ``<prefix>confusion.png`` and
    ``<prefix>confusion.json`` (matrix, classes, per-class accuracy) on ``run_id``; return the JSON."""
    conf = torch.as_tensor(confusion)
    per_class = per_class_accuracy(conf)
    safe = [re.sub(r"[^A-Za-z0-9_\-. /]", "_", c) or "_" for c in classes]
    metrics = {f"{prefix}class_acc.{c}": a for c, a in zip(safe, per_class, strict=True) if a == a}
    items = list(metrics.items())
    for i in range(0, len(items), 900):  # MLflow takes at most 1000 metrics per batch
        registry.log_metrics(run_id, dict(items[i:i + 900]), step or 0, tracking)
    report = {"classes": list(classes), "confusion": conf.tolist(), "per_class_top1": per_class}
    c = registry.client(tracking)
    with tempfile.TemporaryDirectory() as tmp:
        confusion_png(conf, list(classes), Path(tmp, f"{prefix}confusion.png"), title or f"{prefix}confusion")
        Path(tmp, f"{prefix}confusion.json").write_text(json.dumps(report))
        c.log_artifact(run_id, str(Path(tmp, f"{prefix}confusion.png")))
        c.log_artifact(run_id, str(Path(tmp, f"{prefix}confusion.json")))
    return report


def tag_version(ref: EncoderRef, tags: dict[str, float], tracking: str) -> None:
    """Write ``tags`` (e.g. ``downstream.digits.top1``) on the encoder's registered version, if it has one."""
    if ref.version is None:
        return
    c = registry.client(tracking)
    for k, v in tags.items():
        c.set_model_version_tag(ref.name, ref.version, k, f"{v:.2f}")


def run_tags(ref: EncoderRef, kind: str, data: DataConfig) -> dict[str, str]:
    """Tags of a downstream run: what it is, the encoder it started from, the data."""
    tags = {"ropim.kind": kind, "ropim.encoder_uri": ref.uri, "ropim.dataset": dataset_name(data)}
    if ref.version:
        tags |= {"ropim.encoder_name": ref.name, "ropim.encoder_version": ref.version}
    return tags
