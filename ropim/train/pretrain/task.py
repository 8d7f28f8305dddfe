"""ROPIM pretraining as the training loop runs it.

``PretrainTask`` supplies the loop with the ROPIM model and its AdamW optimizer, the batches (a DataLoader, or a
Ray Data shard with ``ingest=ray_data``), the loss with a fresh corruption per step drawn from
(seed, step, rank), the kNN / linear-probe evaluation of the encoder (epochs before the job's last in a background
thread on a copy of the encoder, with ``eval_async``), and rank 0's epoch hook (an MLflow metrics
line, reconstruction pictures).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from timm.optim import create_optimizer_v2

from ropim.core.model import ROPIM
from ropim.data.blocks import RAY_DATA_READING, mixing_note
from ropim.data.datasets import build_dataset, pretrain_transform, validation_images
from ropim.data.sources import count_images, open_source
from ropim.errors import first_line
from ropim.seeds import derived_seed
from ropim.tracking import store
from ropim.train.background import Background
from ropim.train.downstream import frozen_scores
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.speed import adamw_kernels, images_to, side_stream
from ropim.train.task import EpochData, Task, Worker, bad_images, epoch_steps, percents

log = logging.getLogger("ropim.train")


def sketch_generator(seed: int, step: int, rank: int, device: torch.device) -> torch.Generator:
    """The generator of step ``step`` on ``rank``: corruptions are reproducible from (seed, step, rank); the micro
    batches of one step (``accum_steps`` > 1) draw one after the other from it, each image its own sketch."""
    return torch.Generator(device=device).manual_seed(derived_seed(seed, step, rank))


def log_pictures(run_id: str, tracking_uri: str, model: ROPIM, imgs: torch.Tensor, epoch: int, seed: int,
                 figure5: bool) -> None:
    """Reconstruction grid of ``imgs`` (paper Figs. 3/6/7) and, once, the Figure-5 token errors, as PNG artifacts."""
    from ropim.viz.figure5 import token_error_figure, token_errors
    from ropim.viz.grids import save_reconstruction_grid

    with tempfile.TemporaryDirectory() as tmp:
        pictures = [Path(tmp) / f"reconstruction_epoch{epoch:04d}.png"]
        save_reconstruction_grid(model, imgs, pictures[0], torch.Generator().manual_seed(seed))
        if figure5:
            pictures.append(Path(tmp) / "token_errors.png")
            token_error_figure(token_errors(imgs, model.cfg.patch_size), pictures[1])
        for picture in pictures:
            store.log_artifact(run_id, picture, "pictures", tracking_uri)


class PretrainTask(Task):
    """ROPIM pretraining as the loop sees it."""

    CONFIG = PretrainConfig

    def __init__(self, config: dict, worker: Worker) -> None:
        super().__init__(config, worker)
        self.n_train, self.bad_counter = config["n_train"], config.get("bad_images")
        self.viz_imgs, self.background = None, Background("ropim-eval")
        self.wait_shown = False  # the line saying training waited for a background evaluation, once per job
        self.pictures_refused = False  # the store did not take the last pictures (said once until it takes them)
        self.drawing: tuple[int, torch.Generator | None] = (-1, None)  # the step whose corruptions are being drawn
        if worker.rank == 0 and self.cfg.viz_every:
            self.viz_imgs = validation_images(self.cfg.data, self.cfg.model.img_size)  # the same few every time

    @classmethod
    def inputs(cls, cfg: PretrainConfig) -> tuple[dict, dict | None]:
        """(what the workers' config adds: the training split's size, Ray Data's bad-image counter; the Ray datasets)
        of a pretraining job; Ray must be up for ``ingest=ray_data``."""
        n_train = count_images(cfg.data, "train")
        if cfg.ingest != "ray_data":
            return {"n_train": n_train}, None
        if note := mixing_note(open_source(cfg.data).split("train"), RAY_DATA_READING):  # the listing counted
            log.warning(f"[pretrain] {note}")
        from ropim.data.ingest import build_ray_dataset, new_bad_image_counter

        counter = new_bad_image_counter()
        return {"n_train": n_train, "bad_images": counter}, {"train": build_ray_dataset(
            cfg.data, "train", cfg.model.img_size, shuffle_seed=cfg.seed, bad_images=counter)}

    def build(self, worker: Worker) -> tuple[ROPIM, torch.optim.Optimizer]:
        self.model = ROPIM(self.cfg.model).to(worker.device)
        optimizer = create_optimizer_v2(self.model, "adamw", lr=self.cfg.lr, weight_decay=self.cfg.weight_decay,
                                        betas=(0.9, self.cfg.beta2), **adamw_kernels(self.cfg.adamw))
        return self.model, optimizer

    def data(self, worker: Worker, micro_batch: int) -> EpochData:
        cfg = self.cfg
        if cfg.ingest == "ray_data":
            import ray.train

            from ropim.data.ingest import bad_image_summary, iter_epoch

            if cfg.dataloader_workers and worker.rank == 0:
                log.info(f"[pretrain] ingest ray_data: Ray Data's tasks decode the training images; the evaluations' "
                         f"decode in dataloader_workers={cfg.dataloader_workers} DataLoader processes")
            shard = ray.train.get_dataset_shard("train")  # an equal split: every worker gets as many batches
            counter = self.bad_counter
            return EpochData(
                batches=lambda epoch: iter_epoch(shard, micro_batch, epoch, seed=cfg.seed, rank=worker.rank),
                steps=epoch_steps(self.n_train // worker.world // micro_batch, self.n_train, cfg),
                stats={"bad_images": (lambda: bad_image_summary(counter)["count"] if counter is not None else 0,
                                      "max")},  # one counter for the whole dataset
            )
        dataset = build_dataset(cfg.data, "train", pretrain_transform(cfg.model.img_size), cfg.model.img_size)
        return self.sharded(dataset, micro_batch, stats={"bad_images": bad_images(dataset)})

    def loss(self, model: torch.nn.Module, batch, step: int) -> tuple[torch.Tensor, int]:
        device = self.worker.device
        imgs = images_to(batch[0], device, self.cfg.channels_last, non_blocking=self.cfg.pin_memory)
        if step != self.drawing[0]:  # a step's first micro batch; the step's others draw on from its generator
            self.drawing = (step, sketch_generator(self.cfg.seed, step, self.worker.rank, device))
        corruption = self.model.draw_corruption(imgs.shape[0], self.drawing[1])  # outside a compiled forward
        loss, _, _ = model(imgs, corruption=corruption)
        return loss, imgs.shape[0]

    def evaluate(self, model: ROPIM, epoch: int, final: bool) -> dict[str, float]:
        if final or not self.cfg.eval_async:  # every worker extracts its share
            return self.scores(model.encoder, progress=f"[pretrain] epoch {epoch} kNN", worker=self.worker)
        if self.worker.rank != 0:
            return {}
        waited = self.background.make_room()  # one evaluation beside training at a time: one copy of the encoder
        if waited > 0.05 and not self.wait_shown:
            self.wait_shown = True
            log.info(f"[pretrain] epoch {epoch}: training waited {waited:.1f} s for the previous evaluation, which "
                     f"took longer than eval_every={self.cfg.eval_every} epochs (said once); a larger eval_every "
                     "keeps training at full speed")
        encoder = copy.deepcopy(model.encoder)  # a copy on the same device: training changes the live weights
        stream = side_stream(self.worker.device)  # ordered after the copy's kernels, on this (training's) thread
        self.background.submit(epoch, lambda: self.scores(encoder, self.background.cancelled, stream=stream))
        return {}

    def resumed(self, model: ROPIM, epoch: int) -> None:
        """A stop ends the evaluation beside training unrecorded (``drop_evaluations``): when it was that of the
        restored epoch, which is not trained again, evaluate the restored weights now, beside training."""
        cfg = self.cfg
        if self.worker.rank != 0 or not cfg.eval_async or not cfg.eval_every or epoch % cfg.eval_every:
            return
        try:
            if epoch in store.metric_steps(self.run_id, "knn_top1", self.tracking):
                return
        except store.TrackingError as err:  # a store that does not answer (a server down): training goes on without it
            log.warning(f"[pretrain] whether epoch {epoch} was evaluated is unknown ({first_line(err)}): not "
                        "evaluated again")
            return
        log.info(f"[pretrain] epoch {epoch}'s evaluation did not finish before the job stopped: evaluating the "
                 "restored weights beside training")
        self.evaluate(model, epoch, final=False)

    def scores(self, encoder: torch.nn.Module, cancelled: Callable[[], bool] | None = None,
               progress: str | None = None, worker: Worker | None = None,
               stream: torch.cuda.Stream | None = None) -> dict[str, float]:
        """kNN (and linear-probe) top-1 of ``encoder``; on a GPU in a CUDA stream of its own (``stream``, made by the
        training's thread for an evaluation in the background: training's kernels keep theirs); ``cancelled`` ends it
        early, ``progress`` starts its progress lines (``frozen_scores``: none beside training, where they would cut
        into the epoch lines); with ``worker``, every worker calls it and extracts its share of the images (rank 0
        gets the scores)."""
        cfg = self.cfg
        stream = stream or side_stream(self.worker.device)
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            return frozen_scores(encoder, cfg.model.img_size, cancelled=cancelled, progress=progress, worker=worker,
                                 **cfg.scores_options())

    def evaluations(self, wait: bool) -> list[dict]:
        done = self.background.collect(wait)
        for m in done:
            log.info(f"[pretrain] epoch {m['epoch']} evaluated beside training: "
                     + " ".join(percents(m, "knn_top1", "linear_top1")))
        if wait:
            self.background.close()
        return done

    def drop_evaluations(self) -> None:
        self.background.close(cancel=True)  # the one in flight ends at its next batch; the process need not wait

    def epoch_end(self, model: ROPIM, metrics: dict) -> None:
        cfg, epoch = self.cfg, metrics["epoch"]
        self.log_epoch(metrics, f"loss {metrics['loss']:.4f}", f"data wait {100 * metrics['data_wait_share']:.1f}%",
                       *percents(metrics, "knn_top1", "linear_top1"))
        due = self.viz_imgs is not None and (epoch % cfg.viz_every == 0 or epoch == cfg.epochs)
        if not due:
            return
        why = None if self.store_answers(epoch) else f"no answer from {self.tracking}"  # down: no MLflow retries
        if why is None:
            try:
                log_pictures(self.run_id, self.tracking, model, self.viz_imgs, epoch, cfg.seed,
                             figure5=epoch == cfg.epochs)
                self.pictures_refused = False
                return
            except store.TrackingError as err:  # a store that does not take them does not stop training
                why = first_line(err)
        if not self.pictures_refused:
            log.warning(f"[pretrain] epoch {epoch}'s pictures not stored: the tracking store did not take them "
                        f"({why}); training goes on (said once until it takes them again)")
        self.pictures_refused = True
