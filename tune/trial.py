"""One Tune trial: a Ray Train pretraining run whose metrics Tune sees, tracked as a child MLflow run of the sweep.

A trial restarted after an interruption continues from its latest Train checkpoint in the same MLflow run.
"""

from __future__ import annotations

import dataclasses
import functools
import json

from ropim.tracking import store
from ropim.tracking.runs import open_run
from ropim.train.config import PretrainConfig
from ropim.train.pretrain import loop_inputs, worker_main
from ropim.train.runtime import fit
from tune.resources import record_placement_group
from tune.spaces import apply_trial


def trial_driver(config: dict, ctx: dict) -> None:
    """Tune's trainable: train the trial's pretraining config; ``ctx`` holds what every trial of the sweep shares."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = ray.tune.get_context().get_trial_id()
    uri, storage = ctx["tracking_uri"], ctx["train_storage"]
    cfg = PretrainConfig.from_dict(apply_trial(ctx["pretrain"], config))
    cfg = dataclasses.replace(cfg, run_name=f"trial_{trial_id}", storage_path=storage)
    tags = {"mlflow.parentRunId": ctx["parent_run_id"], "ropim.kind": "sweep-trial", "ropim.sweep": ctx["sweep"],
            "ropim.trial_id": trial_id, "ropim.trial_config": json.dumps(config)}
    with open_run(experiment=ctx["experiment"], name=cfg.run_name, title=f"{ctx['sweep']}/{trial_id}",
                  storage_path=storage, config=cfg.to_dict(), tags=tags, uri=uri,
                  lock=False) as run:  # Tune runs a trial once at a time, possibly on another node after a restart
        loop_config, datasets = loop_inputs(cfg, run.run_id, uri)
        result = fit(functools.partial(record_placement_group, worker_main), loop_config, cfg,
                     callbacks=[TuneReportCallback()], datasets=datasets, storage_path=storage)
        store.set_tags(run.run_id, {"ropim.checkpoint": result.checkpoint_path or ""}, uri)
