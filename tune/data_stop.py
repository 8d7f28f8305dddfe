"""Stop a sweep at the first trial that fails on its data or storage.

Every trial of a sweep reads the same data and writes to the same storage, so an error in them (a
``ropim.errors.DataError``: an image that does not decode under ``on_bad_image=fail``, a shard cut short, a full
disk) fails every trial in turn, each after training up to it. The first trial to meet one ends the sweep with that
error instead; an error of one trial's settings (a diverged loss) fails that trial only, as before.
"""

from __future__ import annotations

import os

import cloudpickle
from ray.tune import Callback

from ropim.console import raised
from ropim.errors import DataError, first_line, input_line
from ropim.tracking import store
from ropim.tracking.runs import Run
from tune.config import SweepConfig
from tune.outcome import end_unfinished_trials


class TrialDataError(DataError):
    """A trial's ``DataError``, raised out of ``Tuner.fit`` (the sweep ends on it); ``trial_id`` names the trial."""

    def __init__(self, trial_id: str, err: DataError) -> None:
        super().__init__(input_line(err) or first_line(err))
        self.trial_id = trial_id


def trial_error(trial) -> BaseException | None:
    """The exception a failed Tune trial raised (Tune's pickled copy, beside the trial's results), taken out of Ray's
    task error; None when Tune kept none (an actor that died)."""
    path = trial.pickled_error_file
    if not path or not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return raised(cloudpickle.load(f))


class StopAtDataError(Callback):
    """Tune callback: raises ``TrialDataError`` when a trial fails on a ``DataError``; Tune ends the experiment on it
    (the trials still running are stopped, the experiment keeps what it last saved for ``--resume``) and raises it
    out of ``Tuner.fit``, inside its own error."""

    def on_trial_error(self, iteration, trials, trial, **info):
        if isinstance(err := trial_error(trial), DataError):
            raise TrialDataError(trial.trial_id, err)


def sweep_stopped(cfg: SweepConfig, run: Run, met: TrialDataError) -> DataError:
    """The sweep's end on trial ``met.trial_id``'s data error: the trials' runs still RUNNING marked KILLED, the
    parent run's state said; the error to end the command with (its line names the error, the trial and the resume
    command)."""
    stopped = end_unfinished_trials(cfg, run.run_id, run.tracking_uri)
    store.set_tags(run.run_id, {"ropim.state": f"failed: trial {met.trial_id}: {met}"}, run.tracking_uri)
    also = f" and its {stopped} other running trial(s)" if stopped else ""
    return DataError(f"{met} (trial {met.trial_id} of sweep {cfg.name}; every trial reads the same data and storage, "
                     f"so the sweep stopped{also}; once fixed, continue with `{cfg.resume_command}`)")
