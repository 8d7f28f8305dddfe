"""How a sweep runs its trials: the TPE sampler (a short sweep is not a random search) and how many trials run at
once (each reading its data)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import optuna
import pytest
from ray.tune.schedulers import TrialScheduler

from ropim.errors import ConfigError
from tune.driver import FinishingASHA, default_concurrency, tpe_sampler
from tune.sweep import config_from_args

optuna.logging.set_verbosity(optuna.logging.WARNING)


def random_prefix(sampler: optuna.samplers.BaseSampler, seed: int, trials: int = 8) -> int:
    """How many of ``sampler``'s first trials match a random search of the same seed, on a quadratic in x."""
    studies = [optuna.create_study(sampler=s) for s in (sampler, optuna.samplers.RandomSampler(seed=seed))]
    drawn: list[list[float]] = [[], []]
    for study, xs in zip(studies, drawn, strict=True):
        for _ in range(trials):
            t = study.ask()
            x = t.suggest_float("x", -1.0, 1.0)
            study.tell(t, (x - 0.3) ** 2)
            xs.append(x)
    return next((i for i, (a, b) in enumerate(zip(*drawn, strict=True)) if a != b), trials)


def test_the_tpe_preset_models_the_scores_after_half_its_trials():
    cfg = config_from_args(["--preset", "tpe"])  # 8 trials: Optuna's default 10 random ones would be all of them
    assert (cfg.num_samples, cfg.n_startup) == (8, 4)
    assert random_prefix(tpe_sampler(cfg), cfg.search_seed) == 4


def test_startup_trials_given_on_the_command_line_are_kept():
    cfg = config_from_args(["--preset", "tpe", "--num-samples", "40", "--startup-trials", "6", "--search-seed", "3"])
    assert random_prefix(tpe_sampler(cfg), 3, trials=10) == 6
    assert config_from_args(["--preset", "tpe", "--num-samples", "40"]).n_startup == 10  # Optuna's own, at most


def test_trials_reading_through_ray_data_leave_their_tasks_a_cpu():
    assert default_concurrency({"CPU": 16}, 2, 1.0, False) == 8
    assert default_concurrency({"CPU": 16}, 2, 1.0, False, "ray_data") == 5  # 3 CPUs a trial: workers and its tasks
    assert default_concurrency({"CPU": 16, "GPU": 2}, 2, 1.0, True, "ray_data") == 1


def test_a_given_concurrency_that_holds_every_cpu_for_ray_data_is_refused():
    cfg = config_from_args(["--ingest", "ray_data", "--max-concurrent", "4", "--workers-per-trial", "2"])
    with pytest.raises(ConfigError, match=r"max_concurrent=4 trials × num_workers=2 × cpus_per_worker=1 hold 8 of the "
                                          r"8 CPUs of c, leaving Ray Data's read and decode tasks 0 .* use "
                                          r"--cpus_per_worker 0.87, --max-concurrent 3 or --ingest torch"):
        cfg.check_data_cpus(8, "c")
    cfg.check_data_cpus(9, "c")  # one CPU left: the trials' tasks share it
    cfg.check_data_cpus(6, "c")  # not all fit now: they wait for nodes, judged as they join
    replace(cfg, max_concurrent=None).check_data_cpus(8, "c")  # the default leaves each trial a CPU


@pytest.mark.parametrize("max_t,eval_every", [(8, 1), (100, 50)])
def test_asha_never_stops_a_trial_at_its_last_epoch(max_t, eval_every):
    """8 epochs: ASHA's top rung is epoch 8 itself; 100 epochs evaluated every 50: the last result is the first past
    rung 64. Worse trials reaching their last epoch end by themselves (their driver records the run); before it they
    are still stopped."""
    asha = FinishingASHA(epochs=max_t, time_attr="epoch", metric="knn_top1", mode="max", max_t=max_t,
                         grace_period=1, reduction_factor=2)
    trials = [SimpleNamespace(trial_id=str(i), config={}) for i in range(6)]
    for t in trials:
        asha.on_trial_add(None, t)
    last = [asha.on_trial_result(None, t, {"epoch": max_t, "knn_top1": 90.0 - i}) for i, t in enumerate(trials[:3])]
    assert last == [TrialScheduler.CONTINUE] * 3
    mid = max_t - eval_every if eval_every > 1 else max_t // 2
    early = [asha.on_trial_result(None, t, {"epoch": mid, "knn_top1": 90.0 - i}) for i, t in enumerate(trials[3:])]
    assert TrialScheduler.STOP in early
    sampled = SimpleNamespace(trial_id="s", config={"epochs": mid})  # a sweep sampling the epochs: the trial's own
    asha.on_trial_add(None, sampled)
    assert asha.on_trial_result(None, sampled, {"epoch": mid, "knn_top1": 0.0}) == TrialScheduler.CONTINUE
