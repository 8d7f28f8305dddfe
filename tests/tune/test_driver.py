"""The sweep's TPE sampler (``tune.driver.tpe_sampler``): a short sweep is not a random search."""

from __future__ import annotations

import optuna

from tune.driver import tpe_sampler
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
