"""What a sweep prints while it runs: one ``[sweep]`` line when a trial starts, ends or fails, and a status line
every ``every_s`` seconds, in place of Ray Tune's status table every 30 s (a table per trial and heartbeat: on a
sweep of long trials, most of its output). The trials' own progress lines stay as they are. Each line ends with the
time the sweep has left (``time_left``), once a trial has trained an epoch.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter

from ray.tune import Callback

from ropim.console import eta_text
from tune.config import SweepConfig
from tune.spaces import apply_trial

# Tune's trial statuses, as the lines say them (in this order)
STATES = {"RUNNING": "running", "PENDING": "pending", "PAUSED": "paused", "TERMINATED": "ended", "ERROR": "failed"}
ORDER = list(STATES.values())


def time_left(running: list[float], pending: list[float], slots: int) -> float:
    """Seconds until the last trial ends: the ``running`` trials' seconds left, then each ``pending`` trial's seconds
    (in order) on the first of ``slots`` trial places to free up, as Tune starts them."""
    free = [*running, *[0.0] * max(0, slots - len(running))]
    heapq.heapify(free)
    for seconds in pending:
        heapq.heappush(free, heapq.heappop(free) + seconds)
    return max(free, default=0.0)


def epoch_of(trial) -> int:
    """The last epoch ``trial`` reported (0 before its first)."""
    return (trial.last_result or {}).get("epoch", 0)


class SweepProgress(Callback):
    """Tune callback: the sweep's ``[sweep]`` lines (see the module)."""

    def __init__(self, cfg: SweepConfig, slots: int = 1, every_s: float = 600.0) -> None:
        self.name, self.metric, self.sign = cfg.name, cfg.metric, 1 if cfg.mode == "max" else -1
        self.pretrain, self.every_s, self.total, self.slots = cfg.pretrain, every_s, cfg.n_trials, slots
        self.early = cfg.scheduler == "asha"  # trials may end before their last epoch: the time left is the most
        self.started = self.shown = time.monotonic()
        self.begun: dict[str, tuple[float, int]] = {}  # trial id -> (when it started here, the epoch it started at)
        self.ran = [0.0, 0]  # seconds and epochs of the trials that ended at their last epoch (their whole cost)

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        """The clock starts where this process runs the experiment: a restored sweep unpickles this callback with
        the times of the process that started it (``time.monotonic`` means nothing across processes)."""
        self.started = self.shown = time.monotonic()
        self.begun = {}

    def say(self, trials: list, what: str, trial=None, now: str = "") -> None:
        """One line: ``what``, then how many trials are in each state (``trial`` counted as ``now``: Tune calls back
        before it sets the new status; those Tune has not made yet are pending), the best score so far and the time
        left (``left``)."""
        state = {t.trial_id: now if t is trial else STATES.get(t.status, t.status.lower()) for t in trials}
        counts = Counter(state.values())
        counts["pending"] += max(0, self.total - len(trials))
        present = sorted((s for s in counts if counts[s]), key=lambda s: ORDER.index(s) if s in ORDER else len(ORDER))
        states = ", ".join(f"{counts[s]} {s}" for s in present)
        print(f"[sweep] {self.name}: {what}; {states}{self.best(trials)}{self.left(trials, state)}", flush=True)
        self.shown = time.monotonic()

    def best(self, trials: list) -> str:
        scored = [(t.last_result[self.metric], t.trial_id) for t in trials if self.metric in (t.last_result or {})]
        if not scored:
            return ""
        score, trial_id = max(scored, key=lambda s: self.sign * s[0])
        return f"; best {self.metric} {score:.2f} (trial {trial_id})"

    def epochs(self, trial) -> int:
        """The epochs ``trial`` trains in all."""
        return apply_trial(self.pretrain, trial.config)["epochs"]

    def per_epoch(self, running: list, now: float) -> float | None:
        """Seconds a trial takes per epoch: of the trials that ended at their last epoch in this process (start-up,
        evaluations, a fine-tune after it included), else of the ``running`` trials' epochs so far (those started
        in this process); None before any epoch ended."""
        if self.ran[1]:
            return self.ran[0] / self.ran[1]
        so_far = [(now - self.begun[t.trial_id][0], epoch_of(t) - self.begun[t.trial_id][1])
                  for t in running if t.trial_id in self.begun]
        epochs = sum(e for _, e in so_far if e > 0)
        return sum(s for s, e in so_far if e > 0) / epochs if epochs else None

    def left(self, trials: list, state: dict[str, str]) -> str:
        """``; about … left``: the running trials' epochs to go and the pending trials' (those Tune has not made
        yet: as many epochs as the made ones' mean) at ``per_epoch``, on ``slots`` trial places; "" before any
        epoch ended, and once no trial is left. ``state``: each trial's, as the line counts it."""
        running = [t for t in trials if state[t.trial_id] == "running"]
        clock = time.monotonic()
        per_epoch = self.per_epoch(running, clock)
        if per_epoch is None:
            return ""
        planned = {t.trial_id: self.epochs(t) for t in trials}
        # a running trial not started here (its start unknown): its epochs to go from where it is now
        begun = {t.trial_id: self.begun.get(t.trial_id, (clock, epoch_of(t))) for t in running}
        to_go = [max(0.0, (planned[t.trial_id] - begun[t.trial_id][1]) * per_epoch - (clock - begun[t.trial_id][0]))
                 for t in running]
        pending = [planned[t.trial_id] * per_epoch for t in trials if state[t.trial_id] == "pending"]
        mean = sum(planned.values()) / len(planned) if planned else self.pretrain["epochs"]
        pending += [mean * per_epoch] * max(0, self.total - len(trials))
        if not to_go and not pending:
            return ""
        seconds = time_left(to_go, pending, self.slots)
        return f"; about {eta_text(seconds)} left" + (" if no trial is stopped early" if self.early else "")

    def on_trial_start(self, iteration, trials, trial, **info):
        self.begun[trial.trial_id] = (time.monotonic(), epoch_of(trial))
        knobs = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in trial.config.items())
        self.say(trials, f"trial {trial.trial_id} started ({knobs})", trial, "running")

    def on_trial_complete(self, iteration, trials, trial, **info):
        result, reached, epochs = trial.last_result or {}, epoch_of(trial), self.epochs(trial)
        t0, e0 = self.begun.pop(trial.trial_id, (None, 0))
        if t0 is not None and reached == epochs > e0:  # its whole cost: every epoch it had left
            self.ran = [self.ran[0] + time.monotonic() - t0, self.ran[1] + epochs - e0]
        score = f", {self.metric} {result[self.metric]:.2f}" if self.metric in result else ""
        self.say(trials, f"trial {trial.trial_id} ended at epoch {reached}/{epochs}{score}", trial, "ended")

    def on_trial_error(self, iteration, trials, trial, **info):
        self.begun.pop(trial.trial_id, None)
        self.say(trials, f"trial {trial.trial_id} failed (its MLflow run says why)", trial, "failed")

    def on_step_end(self, iteration, trials, **info):
        if time.monotonic() - self.shown >= self.every_s:
            self.say(trials, f"{(time.monotonic() - self.started) / 3600:.1f} h in")
