"""A registered model's card: its config, scores (with protocol and data set), lineage and the two ways to load it.
Written as the version's MLflow description when it is registered, and shown by ``ropim models show``."""

from __future__ import annotations


def scores(tags: dict[str, str]) -> dict[str, str]:
    """The version's scores with their protocol and data set: the sweep metric and every downstream score."""
    out = {}
    if "metric" in tags and "metric_value" in tags:
        out[f"{tags['metric']} on {tags.get('metric_dataset', '?')}"] = f"{float(tags['metric_value']):.2f}"
    for k, v in sorted(tags.items()):
        if k.startswith("downstream."):
            _, dataset, metric = k.split(".", 2)
            protocol = {"top1": "fine-tune top-1", "linear_top1": "linear-probe top-1", "knn_top1": "kNN top-1",
                        "miou": "segmentation mIoU"}.get(metric, metric)
            out[f"{protocol} on {dataset}"] = v
    for k, label in (("miou", "mIoU"), ("pixel_acc", "pixel accuracy")):  # a segmenter's own scores
        if k in tags:
            out[f"{label} on {tags.get('dataset', '?')}"] = f"{float(tags[k]):.2f}"
    return out


def first_stage(tags: dict[str, str]) -> dict[str, list[str]]:
    """The lineage entry of a second-stage encoder (tag ``stage``, e.g. ``lgp``): the encoder version it started
    from and the run that trained that one; {} for a first-stage encoder."""
    if not tags.get("source_encoder"):
        return {}
    run = tags.get("source_run")
    return {"first stage": [tags["source_encoder"] + (f" (run {run})" if run else "")]}


LOADERS = {  # kind tag -> (ropim loader, what the pyfunc predicts)
    "segmenter": ("from ropim.tracking.segmenters import load_segmenter", "load_segmenter", "segmenter",
                  "logits = mlflow.pyfunc.load_model(\"{uri}\").predict(images)  # (B, K, H, W), without ropim"),
}
ENCODER_LOADER = ("from ropim.tracking.registry import load_encoder", "load_encoder", "encoder",
                  "features = mlflow.pyfunc.load_model(\"{uri}\").predict(images)  # without ropim (torch, timm)")


def card(name: str, version: str, config: dict, tags: dict[str, str], lineage: dict[str, list[str]]) -> str:
    """A registered model's card: what it is, its scores, where it came from, how to load it (an encoder, or by its
    ``kind`` tag a segmenter)."""
    uri = f"models:/{name}/{version}"
    keys = ("stage", "backbone", "width", "arch", "img_size", "patch_size", "depth", "corruption", "rho", "mask_ratio",
            "loss", "epochs", "dataset", "graft_epochs", "graft_dataset", "lower_blocks", "lower_lr_ratio", "crop_size",
            "num_classes", "channels", "encoder_uri")
    lines = [f"# {name} v{version}", "", "## Config", ""]
    lines += [f"- {k}: {config[k]}" for k in keys if config.get(k) is not None]
    lines += ["", "## Scores", ""] + ([f"- {k}: {v}" for k, v in scores(tags).items()] or ["- none yet"])
    lines += ["", "## Lineage", ""] + [f"- {k}: {', '.join(v) if v else '—'}" for k, v in lineage.items()]
    imports, loader, what, pyfunc = LOADERS.get(str(tags.get("kind")), ENCODER_LOADER)
    lines += ["", "## Load", "", "```python", imports,
              f'{what}, config = {loader}("{uri}")  # with ropim',
              "import mlflow", pyfunc.format(uri=uri), "```"]
    return "\n".join(lines)
