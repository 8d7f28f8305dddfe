"""Pretraining on Ray Train survives a worker that dies mid-epoch: the worker group restarts from the latest
checkpoint and finishes with the uninterrupted step count, every epoch recorded once, one registered encoder —
here with Ray Data ingest from Parquet, 2 workers on 2 CPUs (the setting that used to hang)."""

from __future__ import annotations

import os
import signal

import pytest
from support import tiny_pretrain

from ropim.data.config import DataConfig
from ropim.data.convert import convert
from ropim.tracking import store
from ropim.train.driver import run


@pytest.mark.faults
def test_worker_death_restarts_from_latest_checkpoint_with_ray_data(workdir, ray_session, tmp_path):
    shards = tmp_path / "digits-parquet"
    convert(DataConfig(source="digits"), str(shards), shard_size=400, progress=False)
    cfg = tiny_pretrain(run_name="crash", epochs=2, max_steps_per_epoch=2, num_workers=2, cpus_per_worker=0.5,
                        ingest="ray_data", data=DataConfig(source=str(shards)))
    marker = str(tmp_path / "crashed")

    def crash_once(config: dict, worker) -> None:  # nested: Ray pickles it by value
        """The pretraining worker, except that rank 1 dies hard (``os._exit``) at optimizer step 3, once."""
        from ropim.train.driver import worker_main
        from ropim.train.pretrain import task as module

        original = module.sketch_generator

        def generator(seed, step, rank, device):
            if step == 3 and rank == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # a hard worker death in epoch 2
            return original(seed, step, rank, device)

        module.sketch_generator = generator  # in this worker process only
        worker_main(config, worker)

    def hung(*_):
        raise TimeoutError("pretraining with Ray Data did not finish in 300 s: the 2-CPU hang is back")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(300)
    try:
        result = run(cfg, worker_fn=crash_once)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert os.path.exists(marker)  # the worker did die
    assert result.metrics["epoch"] == 2 and result.metrics["step"] == 4 and result.model_uri is not None
    c = store.client()
    history = sorted(c.get_metric_history(result.run_id, "loss"), key=lambda m: m.step)
    assert [m.step for m in history] == [1, 2]  # epoch 2, retrained after the restart, is recorded once
    assert [m.value for m in sorted(c.get_metric_history(result.run_id, "bad_images"), key=lambda m: m.step)] == \
        [0.0, 0.0]
    assert [m.step for m in c.get_metric_history(result.run_id, "step")] == [1, 2]
    versions = c.search_model_versions(f"run_id='{result.run_id}'")
    assert len(versions) == 1 and c.get_run(result.run_id).info.status == "FINISHED"


def test_resume_config_takes_only_resumable_changes(workdir):
    from ropim.errors import ConfigError
    from ropim.train.jobs import JOBS, resume_config

    with pytest.raises(ConfigError, match="no run of that name"):
        resume_config(JOBS["pretrain"], "ghost", "ray_results", num_workers=1, cpus_per_worker=0.5)
    with pytest.raises(ConfigError, match="epochs cannot change"):
        resume_config(JOBS["pretrain"], "crash", "ray_results", epochs=5)
