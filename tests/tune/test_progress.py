"""A sweep's ``[sweep]`` lines: one when a trial starts, ends or fails, with the trials in each state, the best
score so far and the time left, and a status line every ``every_s`` seconds (in place of Tune's status table every
30 s)."""

from __future__ import annotations

from types import SimpleNamespace

from ropim.train.pretrain.config import PretrainConfig
from tune.config import SweepConfig
from tune.progress import SweepProgress, time_left


def trial(trial_id: str, status: str, rho: float, **result) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, status=status, config={"rho": rho}, last_result=result)


def test_each_trial_event_is_one_line_with_the_states_and_the_best(capsys, monkeypatch):
    cfg = SweepConfig(name="abl", search="grid", space={"rho": {"grid": [0.07, 0.14, 0.25]}},
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})  # Tune makes 2 of its 3 trials first
    clock = [1000.0]
    monkeypatch.setattr("tune.progress.time.monotonic", lambda: clock[0])
    progress = SweepProgress(cfg, slots=1, every_s=600)
    a, b = trial("t_00000", "PENDING", 0.07), trial("t_00001", "PENDING", 0.14)
    progress.on_trial_start(iteration=1, trials=[a, b], trial=a)  # Tune calls back before it sets RUNNING
    a.status, a.last_result = "RUNNING", {"epoch": 8, "knn_top1": 41.25}
    clock[0] += 800  # 100 s an epoch: each trial left takes 800 s, one at a time
    progress.on_trial_complete(iteration=9, trials=[a, b], trial=a)
    a.status, b.status = "TERMINATED", "RUNNING"
    progress.on_trial_error(iteration=12, trials=[a, b], trial=b)
    assert capsys.readouterr().out.splitlines() == [
        "[sweep] abl: trial t_00000 started (rho 0.07); 1 running, 2 pending",
        "[sweep] abl: trial t_00000 ended at epoch 8/8, knn_top1 41.25; 2 pending, 1 ended; best knn_top1 41.25 "
        "(trial t_00000); about 26.7 min left",
        "[sweep] abl: trial t_00001 failed (its MLflow run says why); 1 pending, 1 ended, 1 failed; best knn_top1 "
        "41.25 (trial t_00000); about 13.3 min left"]

    b.status = "ERROR"
    clock[0] = 1e6  # another process: a restored sweep's callback starts its clock in setup
    progress.setup(stop=None, num_samples=1, total_num_samples=3)
    clock[0] += 599.5
    progress.on_step_end(iteration=13, trials=[a, b])
    assert capsys.readouterr().out == ""  # not yet every_s since the last line
    clock[0] += 1.0
    progress.on_step_end(iteration=14, trials=[a, b])
    assert capsys.readouterr().out == ("[sweep] abl: 0.2 h in; 1 pending, 1 ended, 1 failed; best knn_top1 41.25 "
                                       "(trial t_00000); about 13.3 min left\n")  # the epoch time outlives a restore


def test_an_asha_stop_says_the_epoch_it_ended_at_and_the_best_is_of_every_trial(capsys):
    cfg = SweepConfig(name="s", search="grid", space={"rho": {"grid": [0.25, 0.5]}},
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})
    progress = SweepProgress(cfg)
    a = trial("t_00000", "RUNNING", 0.5, epoch=2, knn_top1=12.5)
    b = trial("t_00001", "TERMINATED", 0.25, epoch=8, knn_top1=30.0)
    progress.on_trial_complete(iteration=3, trials=[a, b], trial=a)
    assert capsys.readouterr().out == ("[sweep] s: trial t_00000 ended at epoch 2/8, knn_top1 12.50; 2 ended; best "
                                       "knn_top1 30.00 (trial t_00001)\n")


def test_time_left_starts_each_pending_trial_where_a_place_frees_up():
    assert time_left([100, 300], [200, 200, 200], slots=2) == 500  # 100→300→500 on one place, 300→500 on the other
    assert time_left([50], [100], slots=3) == 100  # a free place takes the pending trial at once
    assert time_left([], [], slots=2) == 0


def test_before_any_trial_ends_the_time_left_is_the_running_trials_pace(capsys, monkeypatch):
    """A 300-epoch sweep's first trial ends after days: until then the running trials' epochs so far give the pace;
    a trial restarted from a checkpoint counts only the epochs it trained here."""
    cfg = SweepConfig(name="long", search="grid", space={"rho": {"grid": [0.07, 0.14, 0.25]}},
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})
    clock = [0.0]
    monkeypatch.setattr("tune.progress.time.monotonic", lambda: clock[0])
    progress = SweepProgress(cfg, slots=2, every_s=600)
    a = trial("t_00000", "PENDING", 0.07)
    b = trial("t_00001", "PENDING", 0.14, epoch=5)  # restored: its checkpoint holds 5 epochs
    for t in (a, b):
        progress.on_trial_start(iteration=1, trials=[a, b], trial=t)
        t.status = "RUNNING"
    capsys.readouterr()
    clock[0] = 600.0
    a.last_result, b.last_result = {"epoch": 3}, {"epoch": 6}  # 4 epochs in 1,200 trial-seconds: 300 s each
    progress.on_step_end(iteration=2, trials=[a, b])
    # a: 8 × 300 − 600 = 1,800 s to go; b: 3 × 300 − 600 = 300 s, then the third trial (never made yet): 2,400 s
    assert capsys.readouterr().out.endswith("; 2 running, 1 pending; about 45.0 min left\n")


def test_an_asha_sweep_says_its_time_left_holds_if_no_trial_is_stopped_early(capsys, monkeypatch):
    cfg = SweepConfig(name="s", search="grid", space={"rho": {"grid": [0.25, 0.5]}}, scheduler="asha",
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})
    clock = [0.0]
    monkeypatch.setattr("tune.progress.time.monotonic", lambda: clock[0])
    progress = SweepProgress(cfg, slots=1)
    a, b = trial("t_00000", "PENDING", 0.25), trial("t_00001", "PENDING", 0.5)
    progress.on_trial_start(iteration=1, trials=[a, b], trial=a)
    a.status, a.last_result, clock[0] = "RUNNING", {"epoch": 2, "knn_top1": 12.5}, 240.0
    progress.on_trial_complete(iteration=2, trials=[a, b], trial=a)  # stopped by ASHA at 2 of 8: not a trial's cost
    assert capsys.readouterr().out.splitlines()[-1].endswith("; 1 pending, 1 ended; best knn_top1 12.50 (trial "
                                                             "t_00000)")  # b pending, no epoch of it ended: no pace
    a.status = "TERMINATED"
    progress.on_trial_start(iteration=3, trials=[a, b], trial=b)
    b.status, b.last_result, clock[0] = "RUNNING", {"epoch": 1}, 840.0  # 600 s an epoch: 7 × 600 s to go
    progress.on_step_end(iteration=4, trials=[a, b])
    assert capsys.readouterr().out.splitlines()[-1].endswith("; about 70.0 min left if no trial is stopped early")


def test_a_trial_running_before_this_process_started_does_not_set_the_pace(capsys, monkeypatch):
    """A restored sweep's callback knows when its own trials started; one it did not see start (its epochs trained
    elsewhere) would read as epochs taking no time."""
    cfg = SweepConfig(name="r", search="grid", space={"rho": {"grid": [0.07, 0.14]}},
                      pretrain={**PretrainConfig().to_dict(), "epochs": 8})
    clock = [0.0]
    monkeypatch.setattr("tune.progress.time.monotonic", lambda: clock[0])
    progress = SweepProgress(cfg, slots=2, every_s=600)
    a = trial("t_00000", "PENDING", 0.07)
    c = trial("t_00001", "RUNNING", 0.14, epoch=4)  # never started here
    progress.on_trial_start(iteration=1, trials=[a, c], trial=a)
    a.status, a.last_result, clock[0] = "RUNNING", {"epoch": 2}, 600.0  # 300 s an epoch
    capsys.readouterr()
    progress.on_step_end(iteration=2, trials=[a, c])
    # a: 8 × 300 − 600 = 1,800 s; c: 4 epochs to go, 1,200 s (with c's 4 epochs in 0 s the pace would be 150 s)
    assert capsys.readouterr().out.endswith("; 2 running; about 30.0 min left\n")
