"""ROPIM pretraining: the task the training loop runs, and the job that opens the run, trains and registers.

``PretrainTask`` supplies the loop with the ROPIM model and its AdamW optimizer, the batches (a DataLoader, or a
Ray Data shard with ``ingest=ray_data``), the loss with a fresh corruption per step drawn from
(seed, step, rank), the kNN / linear-probe evaluation of the encoder (epochs before the job's last in a background
thread on a copy of the encoder, with ``eval_async``), and rank 0's epoch hook (an MLflow metrics
line, reconstruction pictures). ``pretrain(cfg)`` validates, opens (or continues) the MLflow run, trains on
``num_workers`` Ray Train workers (0: in this process), registers the final encoder and returns its URI.
Re-running a named run (same ``run_name`` and ``storage_path``) continues from its latest checkpoint with the
same step count, LR schedule and MLflow run; re-running a finished one reports it and registers nothing.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from timm.optim import create_optimizer_v2
from torch.utils.data import DataLoader, DistributedSampler

from ropim.checks import check_location
from ropim.console import ensure_logging
from ropim.core.model import ROPIM, encoder_spec
from ropim.data.datasets import build_dataset, pretrain_transform, validation_images
from ropim.data.sources import check_batch_fits, count_images
from ropim.errors import ConfigError
from ropim.paths import resolve_path
from ropim.tracking import registry, store
from ropim.tracking.names import default_run_name
from ropim.tracking.runs import open_run, read_run_meta
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.background import Background
from ropim.train.config import PretrainConfig
from ropim.train.downstream import frozen_scores
from ropim.train.loop import train, worker_seed
from ropim.train.runtime import FitResult, WorkerFn, fit, ray_session, run_dir, worker_paths
from ropim.train.speed import adamw_kernels, images_to
from ropim.train.task import EpochData, Worker

log = logging.getLogger("ropim.train")


def encoder_config(cfg: PretrainConfig, embed_dim: int) -> dict:
    """The JSON config stored beside a registered encoder."""
    m = cfg.model
    name, kwargs = encoder_spec(m)
    return {
        "arch": name, "backbone": m.backbone, "width": m.arch, "img_size": m.img_size, "patch_size": m.patch_size,
        "in_chans": m.in_chans, "embed_dim": embed_dim, "depth": m.depth, "rho": m.rho, "corruption": m.corruption,
        "loss": m.loss, "hashing": m.hashing, "mask_ratio": m.mask_ratio, "mask_patch_size": m.mask_patch_size,
        "epochs": cfg.epochs, "dataset": cfg.data.source, "timm_kwargs": kwargs,
    }


def sketch_generator(seed: int, step: int, rank: int, device: torch.device) -> torch.Generator:
    """The generator of step ``step`` on ``rank``: corruptions are reproducible from (seed, step, rank)."""
    return torch.Generator(device=device).manual_seed(worker_seed(seed, step, rank))


def log_pictures(run_id: str, tracking_uri: str, model: ROPIM, imgs: torch.Tensor, epoch: int, seed: int,
                 figure5: bool) -> None:
    """Reconstruction grid of ``imgs`` (paper Figs. 3/6/7) and, once, the Figure-5 token errors, as PNG artifacts."""
    from ropim.viz.figure5 import token_error_figure, token_errors
    from ropim.viz.grids import save_reconstruction_grid

    with tempfile.TemporaryDirectory() as tmp:
        grid = Path(tmp) / f"reconstruction_epoch{epoch:04d}.png"
        save_reconstruction_grid(model, imgs, grid, torch.Generator().manual_seed(seed))
        store.log_artifact(run_id, grid, "pictures", tracking_uri)
        if figure5:
            fig = Path(tmp) / "token_errors.png"
            token_error_figure(token_errors(imgs, model.cfg.patch_size), fig)
            store.log_artifact(run_id, fig, "pictures", tracking_uri)


class PretrainTask:
    """ROPIM pretraining as the loop sees it."""

    loss_name = "loss"

    def __init__(self, config: dict, worker: Worker) -> None:
        self.config = config["cfg"]
        self.cfg = PretrainConfig.from_dict(self.config)
        self.run_id, self.tracking, self.run_dir = config["run_id"], config["tracking_uri"], config["run_dir"]
        self.n_train, self.bad_counter = config["n_train"], config.get("bad_images")
        self.rank, self.device = worker.rank, worker.device
        self.viz_imgs, self.background = None, Background("ropim-eval")
        if self.rank == 0 and self.cfg.viz_every:
            self.viz_imgs = validation_images(self.cfg.data, self.cfg.model.img_size)  # the same few every time

    def build(self, worker: Worker) -> tuple[ROPIM, torch.optim.Optimizer]:
        self.model = ROPIM(self.cfg.model).to(worker.device)
        optimizer = create_optimizer_v2(self.model, "adamw", lr=self.cfg.lr, weight_decay=self.cfg.weight_decay,
                                        betas=(0.9, self.cfg.beta2), **adamw_kernels(self.cfg.adamw))
        return self.model, optimizer

    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        cfg, world = self.cfg, worker.world
        if cfg.ingest == "ray_data":
            import ray.train

            from ropim.data.ingest import bad_image_summary, iter_epoch

            shard = ray.train.get_dataset_shard("train")  # an equal split: every worker gets as many batches
            counter = self.bad_counter
            return EpochData(
                batches=lambda epoch: iter_epoch(shard, micro_batch, epoch, seed=cfg.seed, rank=worker.rank),
                steps=self.n_train // world // micro_batch // cfg.accum_steps,
                stats={"bad_images": (lambda: bad_image_summary(counter)["count"] if counter is not None else 0,
                                      "max")},  # one counter for the whole dataset
            )
        dataset = build_dataset(cfg.data, "train", pretrain_transform(cfg.model.img_size), cfg.model.img_size)
        sampler = DistributedSampler(dataset, num_replicas=world, rank=worker.rank, shuffle=True, seed=cfg.seed,
                                     drop_last=True)
        loader = DataLoader(dataset, batch_size=micro_batch, sampler=sampler, drop_last=True,
                            pin_memory=worker.device.type == "cuda" and cfg.pin_memory)

        def batches(epoch: int):
            sampler.set_epoch(epoch)
            return iter(loader)

        return EpochData(batches, len(loader) // cfg.accum_steps,
                         {"bad_images": (lambda: getattr(getattr(dataset, "bad", None), "count", 0), "sum")})

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        imgs = images_to(batch[0], self.device, self.cfg.channels_last, non_blocking=self.cfg.pin_memory)
        generator = sketch_generator(self.cfg.seed, step, self.rank, self.device)
        corruption = self.model.draw_corruption(imgs.shape[0], generator)  # outside a compiled forward
        loss, _, _ = model(imgs, corruption=corruption)
        return loss, imgs.shape[0]

    def evaluate(self, model: ROPIM, epoch: int, final: bool) -> dict[str, float]:
        if self.rank != 0:
            return {}
        if final or not self.cfg.eval_async:
            return self.scores(model.encoder)
        encoder = copy.deepcopy(model.encoder)  # a copy on the same device: training changes the live weights
        self.background.submit(epoch, lambda: self.scores(encoder))
        return {}

    def scores(self, encoder: torch.nn.Module) -> dict[str, float]:
        """kNN (and linear-probe) top-1 of ``encoder``; on a GPU in a CUDA stream of its own (in the background, the
        training's kernels keep theirs)."""
        cfg = self.cfg
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            return frozen_scores(encoder, cfg.model.img_size, cfg.data, cfg.knn_k, linear=cfg.eval_linear_probe)

    def evaluations(self, wait: bool) -> list[dict]:
        done = self.background.collect(wait)
        for m in done:
            log.info(f"[pretrain] epoch {m['epoch']} evaluated beside training:"
                     + "".join(f" {k} {m[k]:.2f}%" for k in ("knn_top1", "linear_top1") if k in m))
        if wait:
            self.background.close()
        return done

    def epoch_end(self, model: ROPIM, metrics: dict) -> None:
        cfg, epoch = self.cfg, metrics["epoch"]
        quality = "".join(f" {k} {metrics[k]:.2f}%" for k in ("knn_top1", "linear_top1") if k in metrics)
        log.info(f"[pretrain] epoch {epoch}/{cfg.epochs} loss {metrics['loss']:.4f} {metrics['img_per_s']:.1f} img/s "
                 f"data wait {100 * metrics['data_wait_share']:.1f}% {metrics['epoch_time_s']:.1f} s{quality} "
                 f"ETA {(cfg.epochs - epoch) * metrics['epoch_time_s'] / 60:.1f} min")
        if self.viz_imgs is not None and (epoch % cfg.viz_every == 0 or epoch == cfg.epochs):
            log_pictures(self.run_id, self.tracking, model, self.viz_imgs, epoch, cfg.seed, figure5=epoch == cfg.epochs)

    def record(self, epochs: list[dict]) -> None:
        store.log_epochs(self.run_id, epochs, self.tracking)

    def checkpoint_extra(self) -> dict:
        return {}


def worker_main(config: dict, worker: Worker) -> None:
    """One worker of a pretraining job."""
    task = PretrainTask(config, worker)
    train(task, task.cfg.loop(), worker)


def loop_inputs(cfg: PretrainConfig, run_id: str, tracking_uri: str) -> tuple[dict, dict | None]:
    """(the workers' config, the Ray datasets) of a pretraining job; Ray must be up for ``ingest=ray_data``."""
    loop_config = {"cfg": cfg.to_dict(), "run_id": run_id, "tracking_uri": tracking_uri,
                   "n_train": count_images(cfg.data, "train"), "run_dir": run_dir(cfg)}
    if cfg.ingest != "ray_data":
        return loop_config, None
    from ropim.data.ingest import build_ray_dataset, new_bad_image_counter

    loop_config["bad_images"] = new_bad_image_counter()
    return loop_config, {"train": build_ray_dataset(cfg.data, "train", cfg.model.img_size, shuffle_seed=cfg.seed,
                                                    bad_images=loop_config["bad_images"])}


def split_checkpoint(folder: Path, cfg: PretrainConfig) -> tuple[dict, dict, dict]:
    """(encoder weights, encoder config, decoder weights) of a pretraining checkpoint folder."""
    state = load_file(str(Path(folder) / "model.safetensors"))
    decoder = {k: v for k, v in state.items() if not k.startswith("encoder.")}
    encoder_state = {k.removeprefix("encoder."): v for k, v in state.items() if k.startswith("encoder.")}
    return encoder_state, encoder_config(cfg, encoder_state["cls_token"].shape[-1]), decoder


def register_checkpoint(folder: Path, cfg: PretrainConfig, run_id: str, tracking_uri: str) -> str:
    """Register the encoder of a final checkpoint folder (the decoder logged beside it); return its URI."""
    encoder_state, config, decoder = split_checkpoint(folder, cfg)
    with tempfile.TemporaryDirectory() as tmp:
        save_file(decoder, str(Path(tmp) / "decoder.safetensors"))
        store.log_artifact(run_id, Path(tmp) / "decoder.safetensors", "decoder", tracking_uri)
    return registry.register_encoder(run_id, encoder_state, config, cfg.registered_model, tracking_uri)


def export_encoder(folder: Path, cfg: PretrainConfig, dst: Path) -> Path:
    """Write the encoder of a checkpoint folder into the folder ``dst`` as ``encoder.safetensors`` + ``config.json``
    (what ``--encoder FOLDER`` and ``runs:/<run_id>/<path>`` read); return ``dst``."""
    encoder_state, config, _ = split_checkpoint(folder, cfg)
    dst.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in encoder_state.items()}, str(dst / "encoder.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@dataclass(frozen=True)
class PretrainResult:
    """Where a pretraining job left its outputs; ``encoder_uri`` is None while the run is unfinished."""

    run_id: str
    encoder_uri: str | None
    checkpoint_path: str | None
    metrics: dict


def resume_config(run_name: str, storage_path: str = "ray_results", **resumable) -> PretrainConfig:
    """The stored config of run ``run_name``, trained to the end, with resumable fields replaced by ``resumable``."""
    unknown = set(resumable) - set(PretrainConfig.RESUMABLE)
    if unknown:
        raise ConfigError(f"--resume: {', '.join(sorted(unknown))} cannot change when continuing a run")
    check_location(storage_path, "storage_path")
    meta = read_run_meta(storage_path, run_name)
    if meta is None:
        raise ConfigError(f"--resume {run_name}: no run of that name under storage_path={storage_path}")
    return dataclasses.replace(PretrainConfig.from_dict(meta["config"]), **{"stop_after_epochs": None, **resumable})


def resume_command(cfg: PretrainConfig) -> str:
    """The command that continues run ``cfg.run_name``."""
    default = cfg.storage_path == resolve_path("ray_results")
    return f"ropim pretrain --resume {cfg.run_name}" + ("" if default else f" --storage_path {cfg.storage_path}")


def pretrain(cfg: PretrainConfig, *, worker_fn: WorkerFn = worker_main) -> PretrainResult:
    """Validate, train (or continue) the run, register the final encoder; return its URI and the run id."""
    ensure_logging()
    cfg = cfg.resolved().validate()
    cfg.check_resources()
    check_batch_fits(cfg.data, {"global_batch_size": cfg.global_batch_size})
    uri = tracking_uri()
    check_tracking(uri)
    cfg = dataclasses.replace(cfg, run_name=cfg.run_name or default_run_name("pretrain"))
    with open_run(experiment=cfg.experiment, name=cfg.run_name, storage_path=cfg.storage_path, config=cfg.to_dict(),
                  resumable=PretrainConfig.RESUMABLE, tags={"ropim.kind": "pretrain"},
                  config_artifact="config/pretrain.yaml", uri=uri,
                  normalize=lambda stored: PretrainConfig.from_dict(stored).resolved().to_dict(),
                  resume=resume_command(cfg)) as run:
        if run.finished:  # report it; nothing is trained or registered again
            encoder_uri = run.meta.get("encoder_uri") or run.tags.get("ropim.encoder_uri")
            print(f"[pretrain] run {cfg.run_name} already finished (MLflow run {run.run_id}); encoder {encoder_uri}",
                  flush=True)
            return PretrainResult(run.run_id, encoder_uri, run.meta.get("checkpoint"), run.meta.get("metrics", {}))
        where = "in this process" if cfg.num_workers == 0 else f"on {cfg.num_workers} Ray Train workers"
        print(f"[pretrain] run {cfg.run_name} {where}: MLflow run {run.run_id} at {uri}", flush=True)
        with ray_session(needed=cfg.num_workers > 0, paths=worker_paths(cfg)):
            loop_config, datasets = loop_inputs(cfg, run.run_id, uri)
            result = fit(worker_fn, loop_config, cfg, datasets=datasets)
        return finish(cfg, run, result)


def finish(cfg: PretrainConfig, run, result: FitResult) -> PretrainResult:
    """Register the encoder of a completed run, or mark the run stopped; record the outcome."""
    encoder_uri = None
    if result.metrics.get("epoch") == cfg.epochs:
        with result.checkpoint_dir() as folder:
            encoder_uri = register_checkpoint(folder, cfg, run.run_id, run.tracking_uri)
        store.set_tags(run.run_id, {"ropim.encoder_uri": encoder_uri}, run.tracking_uri)
        run.save(encoder_uri=encoder_uri, checkpoint=result.checkpoint_path, metrics=result.metrics)
        print(f"[pretrain] registered encoder {encoder_uri}", flush=True)
    else:
        run.stop()
        print(f"[pretrain] stopped after epoch {result.metrics.get('epoch')}/{cfg.epochs}; continue with "
              f"`{resume_command(cfg)}`", flush=True)
    return PretrainResult(run.run_id, encoder_uri, result.checkpoint_path, result.metrics)
