"""What a sweep's end leaves when its trials failed: a sweep none of whose trials scored fails (exit 1, its parent
run FAILED, nothing registered) so that ``--resume`` runs them again, instead of ending FINISHED with no encoder."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ropim.errors import JobFailed
from ropim.tracking import store
from ropim.tracking.run_meta import read_run_meta
from ropim.tracking.runs import open_run
from ropim.train.pretrain.config import PretrainConfig
from tune.config import SweepConfig
from tune.outcome import collect_rows, finish


@dataclass
class FailedTrial:
    """What Ray Tune's result grid holds for a trial whose driver died (e.g. killed by Ray's memory monitor)."""

    metrics: dict = field(default_factory=lambda: {"trial_id": "t0"})
    error: Exception | None = field(default_factory=lambda: RuntimeError("killed by Ray's memory monitor"))
    config: dict = field(default_factory=dict)
    path: str = "ray_results/s/train/trainable_t0_00000_0_rho=0.5"


def test_a_sweep_none_of_whose_trials_scored_fails_and_stays_resumable(workdir):
    cfg = SweepConfig(name="allfailed", storage_path="ray_results", pretrain=PretrainConfig().to_dict())
    failed = r"sweep allfailed: 1 of 1 trials failed and none scored .*nothing registered; run them again with "
    with pytest.raises(JobFailed, match=failed + "`ropim sweep --resume allfailed"), \
            open_run(experiment=cfg.experiment, name=cfg.name, storage_path=cfg.storage_path,
                     config=cfg.to_dict()) as run:
        finish(cfg, [FailedTrial()], run)
    parent = store.client().get_run(run.run_id)
    assert parent.info.status == "FAILED" and parent.data.tags["ropim.state"].startswith("failed: 1 of 1")
    assert "finished" not in read_run_meta("ray_results", "allfailed")  # --resume continues it, not reports it
    assert not store.client().search_registered_models()


def test_a_trial_killed_as_its_run_was_made_keeps_the_run_its_restart_recorded(workdir):
    """A trial killed between making its MLflow run and storing it makes another when it starts again: its row is the
    run that recorded the trial's checkpoint, not the empty one made first."""
    cfg = SweepConfig(name="orphan", storage_path="ray_results", pretrain=PretrainConfig().to_dict())
    c = store.client()
    with open_run(experiment=cfg.experiment, name=cfg.name, storage_path=cfg.storage_path, config=cfg.to_dict()) as run:
        made = [store.create_run(cfg.experiment, f"orphan/t0-{i}", {}, {"mlflow.parentRunId": run.run_id,
                                                                           "ropim.trial_id": "t0"}) for i in range(2)]
        store.set_tags(made[1], {"ropim.checkpoint": "ray_results/orphan/train/trial_t0/checkpoint_1"})
        trial = FailedTrial(metrics={"trial_id": "t0", "epoch": 1, "knn_top1": 50.0}, error=None)
        rows = collect_rows([trial], cfg, store.tracking_uri(), run.run_id)
    assert [r["mlflow_run"] for r in rows] == [made[1]] and rows[0]["checkpoint"].endswith("checkpoint_1")
    assert c.get_run(made[0]).data.tags["ropim.trial_id"] == "t0"  # the older run is there: not the row's
