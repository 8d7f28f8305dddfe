"""The main job: pretrain on Ray Train -> register the encoder -> fine-tune it and a random-init baseline.

One Ray session serves the pretraining and both fine-tunes when they run on Ray Train (``finetune.num_workers``
> 0); the digits demo fine-tunes in-process, which is faster there.
"""

from __future__ import annotations

import dataclasses

import timm
import torch

from ropim.flows.config import DemoConfig
from ropim.tracking import registry
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.downstream import frozen_scores
from ropim.train.finetune import baseline, finetune
from ropim.train.pretrain import pretrain
from ropim.train.runtime import ray_session


def run_demo(cfg: DemoConfig) -> dict[str, object]:
    """Run the whole path and print the registered URI and both fine-tune top-1s, measured in this run."""
    cfg.validate()
    check_tracking(tracking_uri())
    with ray_session(needed=cfg.finetune.num_workers > 0):  # pretrain starts its own otherwise
        return _run(cfg)


def _run(cfg: DemoConfig) -> dict[str, object]:
    result = pretrain(cfg.pretrain)
    ft_cfg = dataclasses.replace(cfg.finetune, encoder=result.encoder_uri)
    encoder, enc_cfg = registry.load_encoder(result.encoder_uri)
    torch.manual_seed(cfg.finetune.seed)
    random_encoder = timm.create_model(enc_cfg["arch"], pretrained=False, **enc_cfg["timm_kwargs"])
    knn = {
        "ropim": frozen_scores(encoder, enc_cfg["img_size"], ft_cfg.data, linear=False)["knn_top1"],
        "random": frozen_scores(random_encoder, enc_cfg["img_size"], ft_cfg.data, linear=False)["knn_top1"],
    }
    ropim_ft = finetune(ft_cfg)
    random_ft = finetune(baseline(ft_cfg))
    print()
    print(f"registered encoder: {result.encoder_uri}  (MLflow run {result.run_id})")
    print(f"registered classifier: {ropim_ft.get('classifier_uri')}  (fine-tune run {ropim_ft['run_id']})")
    print(f"{'encoder':<24}{'kNN top-1':>12}{'fine-tune top-1':>18}   ({ft_cfg.data.source} val split)")
    print(f"{'ROPIM (this run)':<24}{knn['ropim']:>11.2f}%{ropim_ft['top1']:>17.2f}%")
    print(f"{'random init':<24}{knn['random']:>11.2f}%{random_ft['top1']:>17.2f}%")
    return {"encoder_uri": result.encoder_uri, "knn": knn, "finetune": ropim_ft, "random_init": random_ft}
