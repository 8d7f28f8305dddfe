"""What a sweep prints while it runs: one ``[sweep]`` line when a trial starts, ends or fails, and a status line
every ``every_s`` seconds, in place of Ray Tune's status table every 30 s (a table per trial and heartbeat: on a
sweep of long trials, most of its output). The trials' own progress lines stay as they are.
"""

from __future__ import annotations

import time
from collections import Counter

from ray.tune import Callback

from tune.config import SweepConfig
from tune.spaces import apply_trial

# Tune's trial statuses, as the lines say them (in this order)
STATES = {"RUNNING": "running", "PENDING": "pending", "PAUSED": "paused", "TERMINATED": "ended", "ERROR": "failed"}
ORDER = list(STATES.values())


class SweepProgress(Callback):
    """Tune callback: the sweep's ``[sweep]`` lines (see the module)."""

    def __init__(self, cfg: SweepConfig, every_s: float = 600.0) -> None:
        self.name, self.metric, self.sign = cfg.name, cfg.metric, 1 if cfg.mode == "max" else -1
        self.pretrain, self.every_s, self.total = cfg.pretrain, every_s, cfg.n_trials
        self.started = self.shown = time.monotonic()

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        """The clock starts where this process runs the experiment: a restored sweep unpickles this callback with
        the times of the process that started it (``time.monotonic`` means nothing across processes)."""
        self.started = self.shown = time.monotonic()

    def say(self, trials: list, what: str, trial=None, now: str = "") -> None:
        """One line: ``what``, then how many trials are in each state (``trial`` counted as ``now``: Tune calls back
        before it sets the new status; those Tune has not made yet are pending) and the best score so far."""
        counts = Counter(now if t is trial else STATES.get(t.status, t.status.lower()) for t in trials)
        counts["pending"] += max(0, self.total - len(trials))
        present = sorted((s for s in counts if counts[s]), key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER))
        states = ", ".join(f"{counts[state]} {state}" for state in present)
        print(f"[sweep] {self.name}: {what}; {states}{self.best(trials)}", flush=True)
        self.shown = time.monotonic()

    def best(self, trials: list) -> str:
        scored = [(t.last_result[self.metric], t.trial_id) for t in trials if self.metric in (t.last_result or {})]
        if not scored:
            return ""
        score, trial_id = max(scored, key=lambda s: self.sign * s[0])
        return f"; best {self.metric} {score:.2f} (trial {trial_id})"

    def on_trial_start(self, iteration, trials, trial, **info):
        knobs = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in trial.config.items())
        self.say(trials, f"trial {trial.trial_id} started ({knobs})", trial, "running")

    def on_trial_complete(self, iteration, trials, trial, **info):
        result, epochs = trial.last_result or {}, apply_trial(self.pretrain, trial.config)["epochs"]
        score = f", {self.metric} {result[self.metric]:.2f}" if self.metric in result else ""
        self.say(trials, f"trial {trial.trial_id} ended at epoch {result.get('epoch', 0)}/{epochs}{score}", trial,
                 "ended")

    def on_trial_error(self, iteration, trials, trial, **info):
        self.say(trials, f"trial {trial.trial_id} failed (its MLflow run says why)", trial, "failed")

    def on_step_end(self, iteration, trials, **info):
        if time.monotonic() - self.shown >= self.every_s:
            self.say(trials, f"{(time.monotonic() - self.started) / 3600:.1f} h in")
