"""Frozen-feature evaluation: pooled features extracted once (optionally cached on disk), then a linear probe
(logistic regression on standardised features, in torch) and a cosine kNN (DINO's exp(sim/T) voting).

``probe(cfg)`` runs both for one encoder on one data set, logs top-1 / top-5, per-class accuracy and confusion
matrices to MLflow (experiment ``ropim-probe``), and tags the encoder version with
``downstream.<dataset>.linear_top1`` and ``downstream.<dataset>.knn_top1``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils.data import DataLoader

from ropim import registry
from ropim.data import DataConfig, build_dataset, eval_transform
from ropim.downstream import (
    build_model,
    confusion_matrix,
    dataset_name,
    ensure_logging,
    eval_split,
    log_results,
    resolve_encoder,
    resolved_data,
    run_tags,
    tag_version,
    topk_accuracy,
)
from ropim.errors import ConfigError

log = logging.getLogger("ropim.probe")


@torch.no_grad()
def extract_features(encoder: torch.nn.Module, dataset, batch_size: int = 256, device: torch.device | str | None = None,
                     num_workers: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled features (N, D) and labels (N,) of ``dataset`` under a frozen encoder (returned on CPU); images go
    to ``device`` (default: where the encoder's weights are)."""
    device = device or next(encoder.parameters()).device
    encoder.eval()
    feats, labels = [], []
    for x, y in DataLoader(dataset, batch_size=batch_size, num_workers=num_workers):
        f = encoder.forward_head(encoder.forward_features(x.to(device)), pre_logits=True)
        feats.append(f.float().cpu())
        labels.append(y)
    return torch.cat(feats), torch.cat(labels)


def knn_scores(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, k: int = 20,
               temperature: float = 0.07, n_classes: int | None = None, chunk: int = 1024) -> torch.Tensor:
    """Class votes (V, K) of a cosine kNN: each of the k nearest train features votes exp(sim / T) for its label."""
    train_x, val_x = F.normalize(train_x.float(), dim=1), F.normalize(val_x.float(), dim=1)
    n_classes = n_classes or int(train_y.max()) + 1
    k = min(k, len(train_x))
    votes = []
    for i in range(0, len(val_x), chunk):
        sim, idx = (val_x[i:i + chunk] @ train_x.T).topk(k, dim=1)
        v = torch.zeros(len(sim), n_classes, device=sim.device)
        votes.append(v.scatter_add_(1, train_y.to(sim.device)[idx], (sim / temperature).exp()))
    return torch.cat(votes)


def knn_top1(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
             k: int = 20, temperature: float = 0.07) -> float:
    """Top-1 (%) of a cosine-similarity kNN classifier with exp(sim/T) voting (DINO's protocol)."""
    n_classes = int(max(train_y.max(), val_y.max())) + 1
    votes = knn_scores(train_x, train_y, val_x, k, temperature, n_classes)
    return (votes.argmax(1).cpu() == val_y.cpu()).float().mean().item() * 100


def knn_eval(encoder: torch.nn.Module, img_size: int, data: DataConfig, k: int = 20) -> float:
    """kNN top-1 (%) on the val split, features of the train split as the memory bank."""
    tf = eval_transform(img_size)
    train = extract_features(encoder, build_dataset(data, "train", tf, img_size))
    val = extract_features(encoder, build_dataset(data, "val", tf, img_size))
    return knn_top1(*train, *val, k=k)


class LinearProbe(nn.Module):
    """Standardise features with the train split's mean / std (fixed buffers), then one linear layer."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, n_classes: int) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.linear = nn.Linear(len(mean), n_classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear((x - self.mean) / self.std)


def train_linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, n_classes: int | None = None,
                       epochs: int = 100, lr: float = 1e-3, weight_decay: float = 0.0, batch_size: int = 256,
                       seed: int = 0) -> LinearProbe:
    """Multinomial logistic regression on cached features: AdamW, cosine schedule, shuffled mini-batches."""
    n_classes = n_classes or int(train_y.max()) + 1
    train_x, train_y = train_x.float(), train_y.long().to(train_x.device)
    probe = LinearProbe(train_x.mean(0), train_x.std(0) + 1e-6, n_classes).to(train_x.device)
    opt = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = -(-len(train_x) // batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs * steps_per_epoch)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(train_x), generator=g).to(train_x.device)
        for i in range(0, len(perm), batch_size):
            idx = perm[i:i + batch_size]
            loss = F.cross_entropy(probe(train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    return probe.eval()


def linear_probe(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor,
                 **kwargs) -> dict[str, object]:
    """Fit ``train_linear_probe`` and score it: {'top1', 'top5', 'scores' (V, K) logits}."""
    n_classes = kwargs.pop("n_classes", None) or int(max(train_y.max(), val_y.max())) + 1
    probe = train_linear_probe(train_x, train_y, n_classes, **kwargs)
    with torch.no_grad():
        scores = probe(val_x.float().to(train_x.device)).cpu()
    return {**topk_accuracy(scores, val_y), "scores": scores}


def knn_probe(train_x: torch.Tensor, train_y: torch.Tensor, val_x: torch.Tensor, val_y: torch.Tensor, k: int = 20,
              temperature: float = 0.07, n_classes: int | None = None) -> dict[str, object]:
    """Cosine kNN scored like the linear probe: {'top1', 'top5', 'scores' (V, K) votes}."""
    n_classes = n_classes or int(max(train_y.max(), val_y.max())) + 1
    scores = knn_scores(train_x, train_y, val_x, k, temperature, n_classes).cpu()
    return {**topk_accuracy(scores, val_y), "scores": scores}


@dataclass(frozen=True)
class ProbeConfig:
    """Linear probe and kNN of a frozen encoder on one data set."""

    encoder: str = f"models:/{registry.DEFAULT_ENCODER_NAME}@champion"
    data: DataConfig = field(default_factory=DataConfig)
    img_size: int | None = None  # None: the encoder's; another size resamples the position embedding
    batch_size: int = 256  # feature extraction
    knn_k: int = 20
    knn_temperature: float = 0.07
    linear_epochs: int = 100
    linear_lr: float = 1e-3
    linear_weight_decay: float = 0.0
    linear_batch_size: int = 256
    use_gpu: bool = False
    dataloader_workers: int = 0
    cache_dir: str | None = None  # keep extracted features here (safetensors), keyed by weights, data and size
    seed: int = 0
    experiment: str = "ropim-probe"
    run_name: str | None = None

    def validate(self) -> ProbeConfig:
        """Raise ConfigError naming the bad field and its fix."""
        self.data.validate()
        for name in ("batch_size", "knn_k", "linear_epochs", "linear_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be ≥ 1")
        if self.linear_lr <= 0 or self.knn_temperature <= 0:
            raise ConfigError("linear_lr and knn_temperature must be > 0")
        if self.use_gpu and not torch.cuda.is_available():
            raise ConfigError("use_gpu=true but no CUDA device is visible here; drop --use_gpu")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def _cache_key(state: dict[str, torch.Tensor], data: DataConfig, img_size: int) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    h.update(json.dumps({"data": asdict(data), "img_size": img_size}, sort_keys=True).encode())
    return h.hexdigest()[:20]


def cached_features(encoder: nn.Module, state: dict[str, torch.Tensor], data: DataConfig, img_size: int,
                    val_set, cfg: ProbeConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """{'train_x', 'train_y', 'val_x', 'val_y'}: extracted once, read back from ``cfg.cache_dir`` when there."""
    path = Path(cfg.cache_dir, f"features-{_cache_key(state, data, img_size)}.safetensors") if cfg.cache_dir else None
    if path is not None and path.exists():
        log.info(f"[probe] features from cache {path}")
        return load_file(str(path))
    encoder = encoder.to(device)
    t0 = time.perf_counter()
    train_set = build_dataset(data, "train", eval_transform(img_size), img_size)
    feats = {}
    for split, ds in (("train", train_set), ("val", val_set)):
        feats[f"{split}_x"], feats[f"{split}_y"] = extract_features(encoder, ds, cfg.batch_size, device,
                                                                    cfg.dataloader_workers)
    n = len(feats["train_x"]) + len(feats["val_x"])
    log.info(f"[probe] features of {n} images in {time.perf_counter() - t0:.1f} s "
             f"({n / (time.perf_counter() - t0):.0f} img/s)")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in feats.items()}, str(tmp))
        tmp.rename(path)
    return feats


def probe(cfg: ProbeConfig) -> dict[str, object]:
    """Linear probe and kNN of ``cfg.encoder`` on ``cfg.data``; log to MLflow, tag the encoder version.

    Returns {'linear': {'top1', 'top5'}, 'knn': {'top1', 'top5'}, 'top1', 'top5' (the linear probe's), 'run_id'}.
    """
    ensure_logging()
    cfg.validate()
    tracking = registry.tracking_uri()
    registry.check_tracking(tracking)
    ref, state = resolve_encoder(cfg.encoder, tracking)
    data = resolved_data(cfg.data)
    img_size = cfg.img_size or ref.config["img_size"]
    val_set = eval_split(ref, data, img_size)
    classes = list(val_set.classes)
    device = torch.device("cuda" if cfg.use_gpu else "cpu")
    torch.manual_seed(cfg.seed)
    encoder = build_model(ref.config, state, 0, img_size, uri=ref.uri)

    name = dataset_name(data)
    run_name = cfg.run_name or f"probe-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id = registry.create_run(cfg.experiment, run_name, {**cfg.to_dict(), "encoder": ref.pinned},
                                 run_tags(ref, "probe", data), tracking)
    try:
        f = cached_features(encoder, state, data, img_size, val_set, cfg, device)
        n_classes = len(classes)
        lin = linear_probe(f["train_x"].to(device), f["train_y"], f["val_x"], f["val_y"], n_classes=n_classes,
                           epochs=cfg.linear_epochs, lr=cfg.linear_lr, weight_decay=cfg.linear_weight_decay,
                           batch_size=cfg.linear_batch_size, seed=cfg.seed)
        knn = knn_probe(f["train_x"].to(device), f["train_y"], f["val_x"].to(device), f["val_y"], cfg.knn_k,
                        cfg.knn_temperature, n_classes)
        results = {}
        for method, res in (("linear", lin), ("knn", knn)):
            scores = res.pop("scores")
            registry.log_metrics(run_id, {f"{method}_top1": res["top1"], f"{method}_top5": res["top5"]}, 0, tracking)
            conf = confusion_matrix(scores.argmax(1), f["val_y"], n_classes)
            log_results(run_id, conf, classes, tracking, prefix=f"{method}_",
                        title=f"{method} probe of {ref.label} on {name}: top-1 {res['top1']:.2f}%")
            results[method] = res
        tag_version(ref, {f"downstream.{name}.linear_top1": lin["top1"],
                          f"downstream.{name}.knn_top1": knn["top1"]}, tracking)
    except BaseException:
        registry.end_run(run_id, "FAILED", tracking)
        raise
    registry.end_run(run_id, "FINISHED", tracking)
    print(f"[probe] {ref.label} on {name}: linear top-1 {lin['top1']:.2f}% top-5 {lin['top5']:.2f}%  |  "
          f"kNN (k={cfg.knn_k}) top-1 {knn['top1']:.2f}% top-5 {knn['top5']:.2f}%", flush=True)
    return {**results, "top1": lin["top1"], "top5": lin["top5"], "run_id": run_id}
