"""A sweep's ``[sweep]`` lines: one when a trial starts, ends or fails, with the trials in each state and the best
score so far, and a status line every ``every_s`` seconds (in place of Tune's status table every 30 s)."""

from __future__ import annotations

from types import SimpleNamespace

from ropim.train.pretrain.config import PretrainConfig
from tune.config import SweepConfig
from tune.progress import SweepProgress


def trial(trial_id: str, status: str, rho: float, **result) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status=status, config={"rho": rho}, last_result=result)


def test_each_trial_event_is_one_line_with_the_states_and_the_best(capsys, monkeypatch):
    cfg = SweepConfig(name="abl", search="grid", space={"rho": {"grid": [0.07, 0.14, 0.25]}},
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})  # Tune makes 2 of its 3 trials first
    progress = SweepProgress(cfg, every_s=600)
    a, b = trial("t_00000", "PENDING", 0.07), trial("t_00001", "PENDING", 0.14)
    progress.on_trial_start(iteration=1, trials=[a, b], trial=a)  # Tune calls back before it sets RUNNING
    a.status, a.last_result = "RUNNING", {"epoch": 8, "knn_top1": 41.25}
    progress.on_trial_complete(iteration=9, trials=[a, b], trial=a)
    a.status, b.status = "TERMINATED", "RUNNING"
    progress.on_trial_error(iteration=12, trials=[a, b], trial=b)
    assert capsys.readouterr().out.splitlines() == [
        "[sweep] abl: trial t_00000 started (rho 0.07); 1 running, 2 pending",
        "[sweep] abl: trial t_00000 ended at epoch 8/8, knn_top1 41.25; 2 pending, 1 ended; best knn_top1 41.25 "
        "(trial t_00000)",
        "[sweep] abl: trial t_00001 failed (its MLflow run says why); 1 pending, 1 ended, 1 failed; best knn_top1 "
        "41.25 (trial t_00000)"]

    b.status = "ERROR"
    clock = [1e6]  # another process: a restored sweep's callback starts its clock in setup
    monkeypatch.setattr("tune.progress.time.monotonic", lambda: clock[0])
    progress.setup(stop=None, num_samples=1, total_num_samples=3)
    clock[0] += 599.5
    progress.on_step_end(iteration=13, trials=[a, b])
    assert capsys.readouterr().out == ""  # not yet every_s since the last line
    clock[0] += 1.0
    progress.on_step_end(iteration=14, trials=[a, b])
    assert capsys.readouterr().out.startswith("[sweep] abl: 0.2 h in; 1 pending, 1 ended, 1 failed; best knn_top1 "
                                              "41.25")


def test_an_asha_stop_says_the_epoch_it_ended_at_and_the_best_is_of_every_trial(capsys):
    cfg = SweepConfig(name="s", search="grid", space={"rho": {"grid": [0.25, 0.5]}},
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})
    progress = SweepProgress(cfg)
    a = trial("t_00000", "RUNNING", 0.5, epoch=2, knn_top1=12.5)
    b = trial("t_00001", "TERMINATED", 0.25, epoch=8, knn_top1=30.0)
    progress.on_trial_complete(iteration=3, trials=[a, b], trial=a)
    assert capsys.readouterr().out == ("[sweep] s: trial t_00000 ended at epoch 2/8, knn_top1 12.50; 2 ended; best "
                                       "knn_top1 30.00 (trial t_00001)\n")
