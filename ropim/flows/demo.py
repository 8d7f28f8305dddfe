"""The main job: pretrain on Ray Train -> register the encoder -> score it and a random-init encoder of the same
architecture with kNN, a linear probe and a fine-tune of one recipe and budget -> print a summary.

One Ray session serves the pretraining and both fine-tunes when they run on Ray Train (``finetune.num_workers``
> 0); the digits demo fine-tunes in-process, which is faster there.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import timm
import torch

from ropim.flows.config import DemoConfig, prepare_demo
from ropim.tracking import registry, store
from ropim.tracking.uri import tracking_uri
from ropim.train.downstream import frozen_scores
from ropim.train.driver import JobResult, run
from ropim.train.jobs import Prepared
from ropim.train.runtime import ray_session


def run_demo(cfg: DemoConfig, pretrain: Prepared | None = None) -> dict[str, object]:
    """Run the whole path; print the scores of both encoders, the registered URIs and where the outputs are.
    ``pretrain``: the pretraining already prepared from ``cfg`` (``prepare_demo``)."""
    cfg, pretrain = (cfg, pretrain) if pretrain else prepare_demo(cfg)
    with ray_session(needed=cfg.finetune.num_workers > 0):  # pretrain starts its own otherwise
        return _run(cfg, pretrain)


def _run(cfg: DemoConfig, pretrain: Prepared) -> dict[str, object]:
    start = time.perf_counter()
    result = run(pretrain)
    ft_cfg = dataclasses.replace(cfg.finetune, encoder=result.model_uri)
    encoder, enc_cfg = registry.load_encoder(result.model_uri)
    torch.manual_seed(cfg.finetune.seed)
    random_encoder = timm.create_model(enc_cfg["arch"], pretrained=False, **enc_cfg["timm_kwargs"])
    scores = {"ropim": frozen_scores(encoder, enc_cfg["img_size"], ft_cfg.data),
              "random": frozen_scores(random_encoder, enc_cfg["img_size"], ft_cfg.data)}
    ropim_ft, random_ft = run(ft_cfg), run(dataclasses.replace(ft_cfg, random_init=True))
    scores["ropim"]["finetune_top1"] = ropim_ft.metrics["top1"]
    scores["random"]["finetune_top1"] = random_ft.metrics["top1"]
    print_summary(cfg, result, scores, ropim_ft, random_ft, time.perf_counter() - start)
    return {"encoder_uri": result.model_uri, "scores": scores, "finetune": ropim_ft, "random_init": random_ft}


def print_summary(cfg: DemoConfig, result: JobResult, scores: dict, ropim_ft: JobResult, random_ft: JobResult,
                  seconds: float) -> None:
    """The result table, the registered URIs, the pictures and checkpoints, and how to browse them."""
    uri = tracking_uri()
    gain = scores["ropim"]["finetune_top1"] - scores["random"]["finetune_top1"]
    rows = [("ROPIM (pretrained here)", scores["ropim"]), ("random init", scores["random"])]
    print(f"\n== ROPIM demo: {cfg.finetune.data.source} val split, top-1 (%), {seconds / 60:.1f} min ==")
    print(f"{'encoder':<26}{'kNN':>8}{'linear probe':>14}{'fine-tune':>11}")
    for name, s in rows:
        print(f"{name:<26}{s['knn_top1']:>8.2f}{s['linear_top1']:>14.2f}{s['finetune_top1']:>11.2f}")
    print(f"fine-tune gain from pretraining: {gain:+.2f} points (same recipe, {cfg.finetune.epochs} epochs each)")
    print(f"\nregistered encoder:    {result.model_uri}  (pretraining run {result.run_id})")
    print(f"registered classifier: {ropim_ft.model_uri}  (fine-tune run {ropim_ft.run_id})")
    print(f"checkpoints:           {result.checkpoint_path}")
    pictures = [("pretraining", *f) for f in store.artifact_files(result.run_id, "pictures", uri)]
    pictures += [(kind, p, f) for kind, job in (("fine-tune", ropim_ft), ("random init", random_ft))
                 for p, f in store.artifact_files(job.run_id, "", uri) if p.endswith(".png")]
    print("pictures (run: MLflow artifact path -> file):")
    for kind, path, local in pictures:
        print(f"  {kind}: {path}  ->  {local or '(remote artifact store)'}")
    print(f"browse runs, metrics and pictures: {command('mlflow')} ui --backend-store-uri {uri}")
    print(f"the registry from the terminal:    {command('ropim')} models list")


def command(name: str) -> str:
    """``name`` as the user can type it: the path of this interpreter's script (relative when below the working
    directory) when it is there, else the bare name."""
    script = Path(sys.executable).parent / name
    if not script.exists():
        return name
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)
