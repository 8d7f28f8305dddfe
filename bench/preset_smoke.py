"""Every paper preset for 2 optimizer steps at its per-worker batch, in this process, on synthetic data: what one
worker of that job needs before a team rents the GPUs for it. Per preset: time to the first step (model and
optimizer built, first step done), seconds per step (the second), peak memory per worker (CUDA's allocator on a
GPU; the process's resident high-water mark, reset per preset, on CPU) and the size of one training checkpoint
(``ropim.train.checkpoint.save_checkpoint``: weights + optimizer state, as the loop writes it).

The models and optimizers are the jobs' own: read from ``ropim/presets/*/*.yaml`` into the job configs, built by
the library's builders (``ROPIM``; ``build_classifier`` + layer decay; ``MoCo`` + LGP's parameter groups;
``segmenter_from_encoder``), stepped under the preset's precision. The encoder a downstream preset starts from is
a fresh one of the matching pretraining preset's architecture. Per-worker batch: the preset's global batch over its
``num_workers`` × ``accum_steps``; presets without workers (fine-tune, segmentation) over ``--workers`` (8: the
GPU workers of the shipped ``ray_cluster.yaml``).

    python bench/preset_smoke.py                   # on the GPU at the real per-worker batch
    python bench/preset_smoke.py --batch 2         # on this machine: the shape it affords
    python bench/preset_smoke.py --tiny            # CI: depth 1, a quarter of the image size, batch 2

A table on stdout; JSON in ``bench/results/preset_smoke_<device>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import re
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
import yaml
from gpu_devices import device_info  # bench/, beside this file
from record import provenance, write_json  # bench/, beside this file
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2

from ropim.core.backbone import build_classifier, create_encoder
from ropim.core.moco import MoCo, lgp_param_groups
from ropim.core.model import ROPIM, encoder_spec
from ropim.core.segmenter import seg_loss, segmenter_from_encoder
from ropim.eval.segmentation import IGNORE_INDEX
from ropim.train.checkpoint import save_checkpoint
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.graft.config import GraftConfig
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig
from ropim.train.speed import adamw_kernels, autocast_dtype, grad_scaler, resolve_precision

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "ropim" / "presets"
RESULTS = Path(__file__).resolve().parent / "results"
# preset -> (the pretraining preset whose encoder it starts from, classes of its data set)
JOBS: dict[str, tuple[str | None, int]] = {
    "pretrain/vit_tiny_in100": (None, 0), "pretrain/vit_small_in1k": (None, 0), "pretrain/vit_base_in1k": (None, 0),
    "finetune/vit_tiny": ("pretrain/vit_tiny_in100", 100), "finetune/vit_small": ("pretrain/vit_small_in1k", 1000),
    "finetune/vit_base": ("pretrain/vit_base_in1k", 1000), "graft/vit_base_in1k": ("pretrain/vit_base_in1k", 0),
    "segment/ade20k_upernet_vit_base": ("pretrain/vit_base_in1k", 150),
}
CONFIGS = {"pretrain": PretrainConfig, "finetune": FinetuneConfig, "graft": GraftConfig, "segment": SegmentConfig}


@dataclasses.dataclass
class Shape:
    """How this run shrinks the presets: ``None`` keeps the preset's value."""

    batch: int | None = None  # per worker
    depth: int | None = None
    img_scale: float = 1.0
    workers: int = 8  # presets that name no num_workers


def raw(preset: str) -> dict:
    """The preset's YAML as written."""
    return yaml.safe_load((PRESETS / f"{preset}.yaml").read_text()) or {}


def load(preset: str):
    """The job config of ``ropim/presets/<preset>.yaml``."""
    return CONFIGS[preset.split("/")[0]].from_dict(raw(preset))


def scaled(size: int, patch: int, shape: Shape) -> int:
    """``size`` × ``shape.img_scale``, a multiple of ``patch`` (at least 2 patches)."""
    return max(2, round(size * shape.img_scale / patch)) * patch


def per_worker(preset: str, global_batch: int, accum: int, shape: Shape) -> int:
    """The micro batch of one worker: the preset's global batch over its workers (``shape.workers`` where it names
    none) and accumulation steps; ``shape.batch`` when given."""
    workers = raw(preset).get("num_workers", shape.workers)
    return shape.batch or max(1, global_batch // (max(1, workers) * accum))


def encoder_of(preset: str, shape: Shape) -> tuple[str, dict, dict]:
    """(timm name, kwargs, a fresh state dict) of the encoder the pretraining ``preset`` makes, at ``shape``."""
    model = load(preset).model
    model = dataclasses.replace(model, img_size=scaled(model.img_size, model.patch_size, shape),
                                depth=shape.depth or model.depth)
    name, kwargs = encoder_spec(model)
    return name, kwargs, create_encoder(name, kwargs).state_dict()


def images(batch: int, size: int, device: torch.device) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, device=device)


@dataclasses.dataclass
class Job:
    """One preset built for a step: its config, model, optimizer, micro batch, and the loss of one micro batch."""

    cfg: object
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batch: int
    loss: object  # () -> scalar tensor
    img_size: int


def pretrain_job(preset: str, shape: Shape, device: torch.device) -> Job:
    cfg = load(preset)
    model_cfg = dataclasses.replace(cfg.model, img_size=scaled(cfg.model.img_size, cfg.model.patch_size, shape),
                                    depth=shape.depth or cfg.model.depth)
    model = ROPIM(model_cfg).to(device)
    opt = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, cfg.beta2),
                              **adamw_kernels(cfg.adamw))
    batch = per_worker(preset, cfg.global_batch_size, cfg.accum_steps, shape)
    x = images(batch, model_cfg.img_size, device)
    return Job(cfg, model, opt, batch, lambda: model(x, corruption=model.draw_corruption(batch))[0],
               model_cfg.img_size)


def finetune_job(preset: str, shape: Shape, device: torch.device) -> Job:
    cfg, (source, classes) = load(preset), JOBS[preset]
    name, kwargs, state = encoder_of(source, shape)
    model = build_classifier(name, kwargs, state, classes, drop_path=cfg.drop_path).model.to(device)
    opt = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, layer_decay=cfg.layer_decay,
                              **adamw_kernels(cfg.adamw))
    batch = per_worker(preset, cfg.batch_size, 1, shape)
    batch += batch % 2  # Mixup/CutMix pairs the batch with its mirror
    x, y = images(batch, kwargs["img_size"], device), torch.randint(0, classes, (batch,), device=device)
    mixup = Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                  num_classes=classes)
    criterion = SoftTargetCrossEntropy()

    def loss() -> torch.Tensor:
        mixed, soft = mixup(x.clone(), y)
        return criterion(model(mixed), soft)

    return Job(cfg, model, opt, batch, loss, kwargs["img_size"])


def graft_job(preset: str, shape: Shape, device: torch.device) -> Job:
    cfg, (source, _) = load(preset), JOBS[preset]
    name, kwargs, state = encoder_of(source, shape)
    encoder = create_encoder(name, kwargs, drop_path_rate=cfg.drop_path)
    encoder.load_state_dict(state)
    model = MoCo(encoder, cfg.proj_dim, cfg.mlp_dim, cfg.temperature, cfg.freeze_patch_embed).to(device)
    split = cfg if shape.depth is None else dataclasses.replace(cfg, lower_blocks=None)  # LGP's share of the depth
    groups = lgp_param_groups(model, split.split(len(encoder.blocks)), cfg.lower_lr_ratio, cfg.weight_decay)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, cfg.beta2), **adamw_kernels(cfg.adamw))
    batch = per_worker(preset, cfg.global_batch_size, cfg.accum_steps, shape)
    x1, x2 = images(batch, kwargs["img_size"], device), images(batch, kwargs["img_size"], device)

    def loss() -> torch.Tensor:
        model.update_momentum(cfg.momentum)
        return model(x1, x2)

    return Job(cfg, model, opt, batch, loss, kwargs["img_size"])


def segment_job(preset: str, shape: Shape, device: torch.device) -> Job:
    cfg, (source, classes) = load(preset), JOBS[preset]
    name, kwargs, state = encoder_of(source, shape)
    crop = scaled(cfg.crop_size, kwargs["patch_size"], shape)
    seg = segmenter_from_encoder(name, kwargs, state, classes, crop, drop_path=cfg.drop_path, channels=cfg.channels,
                                 aux_channels=cfg.aux_channels, dropout=cfg.dropout)
    model = seg.model.to(device)
    opt = create_optimizer_v2(model, "adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, layer_decay=cfg.layer_decay,
                              **adamw_kernels(cfg.adamw))
    batch = max(2, per_worker(preset, cfg.batch_size, 1, shape))  # batch norm in the decoder needs 2
    x = images(batch, crop, device)
    y = torch.randint(0, classes, (batch, crop, crop), device=device)
    y[:, :, : crop // 8] = IGNORE_INDEX  # some unlabelled pixels, as ADE20K has
    return Job(cfg, model, opt, batch, lambda: seg_loss(model(x), y, cfg.aux_weight, IGNORE_INDEX), crop)


BUILDERS = {"pretrain": pretrain_job, "finetune": finetune_job, "graft": graft_job, "segment": segment_job}


def reset_peak(device: torch.device) -> bool:
    """Reset the peak-memory counter of ``device`` (CUDA's allocator, or this process's VmHWM); False if it cannot."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux ≥ 4.0: VmHWM := current RSS
        return True
    except OSError:
        return False


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def measure(preset: str, shape: Shape, device: torch.device) -> dict:
    """Build ``preset`` and take 2 optimizer steps: times, peak memory, checkpoint size."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    peak_reset = reset_peak(device)
    t0 = time.perf_counter()
    job = BUILDERS[preset.split("/")[0]](preset, shape, device)
    job.model.train()
    precision = resolve_precision(job.cfg.precision, device)
    scaler, dtype = grad_scaler(precision), autocast_dtype(precision)
    clip = getattr(job.cfg, "clip_grad", None)

    def step() -> float:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = job.loss()
        (scaler.scale(loss) if scaler else loss).backward()
        if clip:
            scaler.unscale_(job.optimizer) if scaler else None
            torch.nn.utils.clip_grad_norm_(job.model.parameters(), clip)
        scaler.step(job.optimizer) if scaler else job.optimizer.step()
        scaler.update() if scaler else None
        job.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    losses = [step()]
    sync()
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    losses.append(step())
    sync()
    step_s, peak = time.perf_counter() - t1, peak_mib(device)
    with tempfile.TemporaryDirectory() as folder:
        t2 = time.perf_counter()
        save_checkpoint(Path(folder), job.model, job.optimizer, scaler, 0, 2, {"preset": preset})
        ckpt = sum(f.stat().st_size for f in Path(folder).iterdir()) / 2**20
        ckpt_s = time.perf_counter() - t2
    params = sum(p.numel() for p in job.model.parameters()) / 1e6
    return dict(preset=preset, job=preset.split("/")[0], img_size=job.img_size, batch_per_worker=job.batch,
                precision=precision, params_m=params, first_step_s=first, step_s=step_s, img_per_s=job.batch / step_s,
                peak_mib=peak, peak_kind="cuda_max_memory_allocated" if device.type == "cuda" else
                ("process_VmHWM" if peak_reset else "process_VmHWM_not_reset"), checkpoint_mib=ckpt,
                checkpoint_write_s=ckpt_s, losses=losses, finite=all(v == v and abs(v) != float("inf") for v in losses))


def print_table(rows: list[dict]) -> None:
    print(f"\n{'preset':<34} {'size':>5} {'batch':>5} {'prec':>5} {'params M':>8} {'1st step s':>10} {'s/step':>8} "
          f"{'img/s':>8} {'peak MiB':>9} {'ckpt MiB':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['preset']:<34} failed: {r['error']}")
            continue
        print(f"{r['preset']:<34} {r['img_size']:5d} {r['batch_per_worker']:5d} {r['precision']:>5} "
              f"{r['params_m']:8.1f} {r['first_step_s']:10.2f} {r['step_s']:8.3f} {r['img_per_s']:8.1f} "
              f"{r['peak_mib']:9.0f} {r['checkpoint_mib']:9.0f}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="+", choices=list(JOBS), default=list(JOBS))
    ap.add_argument("--batch", type=int, default=None, help="per-worker batch (default: the preset's)")
    ap.add_argument("--depth", type=int, default=None, help="blocks of every encoder (default: the preset's)")
    ap.add_argument("--img-scale", type=float, default=1.0, help="image and crop sizes × this")
    ap.add_argument("--workers", type=int, default=8, help="workers of the presets that name none")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None, help="JSON (default bench/results/preset_smoke_<device>.json)")
    ap.add_argument("--tiny", action="store_true", help="CPU, depth 1, a quarter of the sizes, batch 2: seconds")
    args = ap.parse_args(argv)
    if args.tiny:
        args.device, args.depth, args.img_scale, args.batch = "cpu", 1, 0.25, args.batch or 2
    if (args.batch is not None and args.batch < 1) or (args.depth is not None and args.depth < 1) \
            or args.img_scale <= 0 or args.workers < 1:
        ap.error("need --batch, --depth, --workers ≥ 1 and --img-scale > 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    t0, device = time.perf_counter(), torch.device(args.device)
    name = device_info(device)[0]
    shape = Shape(batch=args.batch, depth=args.depth, img_scale=args.img_scale, workers=args.workers)
    print(f"{name}; torch {torch.__version__}, timm {timm.__version__}; {dataclasses.asdict(shape)}", flush=True)
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower().split(":")[0]).strip("_")
    out = args.out or RESULTS / f"preset_smoke_{slug}.json"
    rows: list[dict] = []

    def save() -> dict:  # after every preset: a run stopped early keeps what it measured
        report = dict(benchmark="preset_smoke", device=str(device), device_name=name, torch=torch.__version__,
                      timm=timm.__version__, shape=dataclasses.asdict(shape), rows=rows,
                      **provenance("bench/preset_smoke.py", argv, t0))
        write_json(report, out)
        return report

    for preset in args.presets:
        try:
            rows.append(measure(preset, shape, device))
            print(f"{preset}: {rows[-1]['step_s']:.3f} s/step, peak {rows[-1]['peak_mib']:.0f} MiB", flush=True)
        except (RuntimeError, ValueError) as e:  # out of memory, a shape the preset cannot take: say so, go on
            rows.append(dict(preset=preset, job=preset.split("/")[0], error=str(e).splitlines()[0][:300]))
            print(f"{preset}: failed: {rows[-1]['error']}", flush=True)
        save()
    print_table(rows)
    report = save()
    print(f"wrote {out} ({report['wall_s']:.0f} s)")
    return report


if __name__ == "__main__":
    sys.exit(main() and 0)
