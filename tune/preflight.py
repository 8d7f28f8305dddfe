"""A sweep's pre-flight (``prepare``): what ``ropim sweep`` checks before Ray Tune or torch is imported, once per
process. The sweep that passes it is a ``PreparedSweep``, which the driver runs without checking it again."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass

import yaml

from ropim.checks import local_cpus
from ropim.cli import PRESETS
from ropim.errors import ConfigError
from ropim.tracking.names import DEFAULT_ENCODER_NAME, default_run_name
from ropim.tracking.preflight import check_registered_model
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig
from tune.config import SweepConfig
from tune.spaces import apply_trial


@dataclass(frozen=True)
class PreparedSweep(SweepConfig):
    """A sweep that passed ``prepare``: named, its local paths absolute, every value it can take checked."""


def derived(cfg: SweepConfig) -> SweepConfig:
    """``cfg`` as the pre-flight completes it: named, local paths absolute (trials run in other folders), evaluated at
    the final epoch at least (under ASHA, inline), the linear probe on where it is the metric; ConfigError only where
    ASHA lacks the intermediate evaluations. ``--resume`` compares a command line with the stored sweep through it,
    so that the original command typed again changes nothing."""
    cfg = cfg.resolved()
    pretrain = json.loads(json.dumps(cfg.pretrain))
    if cfg.scheduler == "asha" and pretrain.get("eval_every", 0) < 1:
        raise ConfigError("scheduler=asha needs the metric at intermediate epochs: add --eval_every 1")
    if pretrain.get("eval_every", 0) < 1:
        pretrain["eval_every"] = int(max(cfg.max_epochs, pretrain["epochs"]))  # kNN on the final epoch only
    if cfg.scheduler == "asha":  # ASHA reads each epoch's report; an evaluation beside training goes to MLflow only
        pretrain["eval_async"] = False
    if cfg.metric == "linear_top1":
        pretrain["eval_linear_probe"] = True
    segment = cfg.segment
    if cfg.metric == "segment_miou":
        segment = {**segment, "data": asdict(SegmentConfig.from_dict(cfg.trial_segment(pretrain)).resolved().data)}
    return dataclasses.replace(cfg, pretrain=pretrain, segment=segment, name=cfg.name or default_run_name(cfg.preset))


def prepare(cfg: SweepConfig) -> PreparedSweep:
    """Name the sweep, make local paths absolute (trials run in other folders), evaluate at the final epoch at least,
    and validate the sweep, every value each knob can take and the first batches, before Ray starts; a sweep
    already prepared is returned as it is."""
    if isinstance(cfg, PreparedSweep):
        return cfg
    cfg = derived(cfg).validate()
    pretrain = cfg.pretrain
    base = PretrainConfig.from_dict(pretrain).validate()
    if base.stop_after_epochs is not None:
        raise ConfigError(f"stop_after_epochs={base.stop_after_epochs}: a sweep trains each trial's whole schedule (a "
                          "trial stopped part-way would be scored and registered as finished); stop a sweep with "
                          "Ctrl+C or SIGTERM and continue it with --resume NAME")
    for knob, dist in cfg.space.items():
        for value in next(iter(dist.values())):
            try:
                PretrainConfig.from_dict(apply_trial(pretrain, {knob: value})).validate()
            except ConfigError as err:  # name the knob: the flag the user typed is --space, not the field
                raise ConfigError(f"space knob {knob!r} at {value!r}: {err}") from None
    check_downstream(cfg)
    batches = {"global_batch_size": base.global_batch_size}
    if cfg.metric == "finetune_top1":
        batches["finetune.batch_size"] = FinetuneConfig.from_dict(cfg.trial_finetune(pretrain)).validate().batch_size
    if cfg.metric == "segment_miou":
        SegmentConfig.from_dict(cfg.trial_segment(pretrain)).validate()
    if (cpus := local_cpus()) is not None:  # a local Ray; a cluster joined by address: ``run_trials`` once connected
        cfg.check_data_cpus(cpus, "this machine (the local Ray cluster)")
    from ropim.data.sources import check_batch_fits  # pyarrow, no torch

    base.check_bank(check_batch_fits(base.data, batches))
    if cfg.register:  # the best encoder goes into a registered model of encoders
        check_tracking(uri := tracking_uri())
        check_registered_model(pretrain.get("registered_model", DEFAULT_ENCODER_NAME), "encoder", uri)
    return PreparedSweep(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})


def check_downstream(cfg: SweepConfig) -> None:
    """ConfigError when trials pretraining on other data than the built-in digits would be scored downstream with
    the ``rho_ablation`` preset's digits defaults: fine-tuned with the digits demo's recipe (10 epochs, batch 32, no
    augmentation; ``finetune_top1``) or segmented on the digits canvases (``segment_miou``). Their scores would rank
    the sweep and enter the champion rule for that data."""
    source = cfg.pretrain["data"]["source"]
    if source == "digits":
        return
    if cfg.metric == "finetune_top1":
        digits = yaml.safe_load((PRESETS / "finetune" / "digits_demo.yaml").read_text())
        trial = PretrainConfig.from_dict(cfg.pretrain)  # the same recipe: the same protocol the champion rule reads
        if dataclasses.replace(cfg, finetune=digits).protocol(trial) == cfg.protocol(trial):
            raise ConfigError(f"--metric finetune_top1 on data.source={source}: every trial would fine-tune with the "
                              "digits demo's recipe (the rho_ablation preset's: 10 epochs, batch 32, no augmentation); "
                              "give this data's recipe: --finetune FILE (e.g. ropim/presets/finetune/vit_base.yaml, "
                              "the paper's) and/or --finetune.* flags")
    segment = SegmentConfig.from_dict(cfg.trial_segment(cfg.pretrain)) if cfg.metric == "segment_miou" else None
    if segment is not None and segment.data.source == "digits":
        raise ConfigError(f"--metric segment_miou with pretraining on data.source={source}: every trial would be "
                          "scored on the built-in digits canvases; give the segmentation data and recipe: "
                          "--segment FILE (e.g. ropim/presets/segment/ade20k_upernet_vit_base.yaml) and/or "
                          "--segment.data.source PATH")
