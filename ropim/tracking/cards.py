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
    for k, v in sorted(tags.items()):  # an encoder's own, at its run's last epoch: score.digits.knn_top1
        if k.startswith("score."):
            _, dataset, metric = k.split(".", 2)
            out[f"{metric} on {dataset}, its last epoch"] = v
    for k, label in (("top1", "top-1"), ("top5", "top-5"), ("miou", "mIoU"),  # a classifier's, a segmenter's own
                     ("pixel_acc", "pixel accuracy")):
        if k in tags:
            out[f"{label} on {tags.get('dataset', '?')}"] = f"{float(tags[k]):.2f}"
    return out


def stored_lineage(run_id: str | None, tags: dict[str, str]) -> dict[str, list[str]]:
    """The lineage a version's stored card shows, from its run and tags alone: the run, the sweep, a second stage's
    first, a classifier's or segmenter's encoder."""
    lineage = {"run": [run_id] if run_id else [], "sweep": [tags["sweep"]] if tags.get("sweep") else [],
               **first_stage(tags)}
    return lineage | ({"encoder": [tags["encoder_uri"]]} if tags.get("encoder_uri") else {})


def first_stage(tags: dict[str, str]) -> dict[str, list[str]]:
    """The lineage entry of a second-stage encoder (tag ``stage``, e.g. ``lgp``): the encoder version it started
    from and the run that trained that one; {} for a first-stage encoder."""
    if not tags.get("source_encoder"):
        return {}
    run = tags.get("source_run")
    return {"first stage": [tags["source_encoder"] + (f" (run {run})" if run else "")]}


LOADERS = {  # kind -> (import, ropim loader, what it gives, what the pyfunc predicts)
    "encoder": ("from ropim.tracking.registry import load_encoder", "load_encoder", "encoder",
                "features = mlflow.pyfunc.load_model(\"{uri}\").predict(images)  # (B, D), without ropim"),
    "classifier": ("from ropim.tracking.registry import load_classifier", "load_classifier", "classifier",
                   "logits = mlflow.pyfunc.load_model(\"{uri}\").predict(images)  # (B, K), without ropim"),
    "segmenter": ("from ropim.tracking.segmenters import load_segmenter", "load_segmenter", "segmenter",
                  "logits = mlflow.pyfunc.load_model(\"{uri}\").predict(images)  # (B, K, H, W), without ropim"),
}


def kind_of(tags: dict[str, str]) -> str:
    """A registered version's kind ('encoder', 'classifier', 'segmenter') from its tags: its ``kind`` tag; a version
    registered before that tag existed is a classifier when it has ``num_classes`` (segmenters always had the tag)."""
    if tags.get("kind") in LOADERS:
        return tags["kind"]
    return "classifier" if "num_classes" in tags else "encoder"


def card(name: str, version: str, config: dict, tags: dict[str, str], lineage: dict[str, list[str]]) -> str:
    """A registered model's card: what it is, its scores, where it came from, how to load it (by its kind,
    ``kind_of(tags)``)."""
    uri = f"models:/{name}/{version}"
    keys = ("stage", "backbone", "width", "arch", "img_size", "patch_size", "depth", "corruption", "rho", "mask_ratio",
            "loss", "epochs", "dataset", "graft_epochs", "graft_dataset", "lower_blocks", "lower_lr_ratio", "crop_size",
            "num_classes", "channels", "encoder_uri")
    lines = [f"# {name} v{version}", "", "## Config", ""]
    lines += [f"- {k}: {config[k]}" for k in keys if config.get(k) is not None]
    lines += ["", "## Scores", ""] + ([f"- {k}: {v}" for k, v in scores(tags).items()] or ["- none yet"])
    lines += ["", "## Lineage", ""] + [f"- {k}: {', '.join(v) if v else '—'}" for k, v in lineage.items()]
    imports, loader, what, pyfunc = LOADERS[kind_of(tags)]
    lines += ["", "## Load", "", "```python", imports,
              f'{what}, config = {loader}("{uri}")  # with ropim',
              "import mlflow", pyfunc.format(uri=uri), "```"]
    return "\n".join(lines)
