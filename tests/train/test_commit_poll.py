"""A job of a few workers has Ray Train's controller poll every 0.25 s, so that a checkpoint report's wait for the
commit is a fraction of a second, not up to Ray's 2 s (on the digits demo, as long as an epoch's training); a large
job, or an interval the environment sets, keeps its own."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path

import pytest

from ropim.train import runtime
from ropim.train.commit_poll import MAX_WORKERS, POLL_S, POLL_VARIABLE, quick_commits
from ropim.train.pretrain.config import PretrainConfig


def test_ray_still_hands_the_interval_to_its_controller():
    """Pinned Ray's source: the variable is the controller's poll interval (2 s unless set), and Train passes the
    driver's value on to the controller."""
    source = Path(importlib.util.find_spec("ray.train.v2._internal.constants").origin).read_text()
    assert f'HEALTH_CHECK_INTERVAL_S_ENV_VAR = "{POLL_VARIABLE}"' in source
    assert "DEFAULT_HEALTH_CHECK_INTERVAL_S: float = 2.0" in source
    assert re.search(r"ENV_VARS_TO_PROPAGATE = \{[^}]*\bHEALTH_CHECK_INTERVAL_S_ENV_VAR,", source)


def test_a_small_job_polls_quickly_while_it_runs_and_leaves_the_environment_as_it_was(monkeypatch):
    monkeypatch.delenv(POLL_VARIABLE, raising=False)
    with quick_commits(2):
        assert os.environ[POLL_VARIABLE] == str(POLL_S) == "0.25"
    assert POLL_VARIABLE not in os.environ
    with quick_commits(MAX_WORKERS + 1):  # 17 workers: Ray's 2 s
        assert POLL_VARIABLE not in os.environ
    monkeypatch.setenv(POLL_VARIABLE, "1.5")  # the user's own
    with quick_commits(2):
        assert os.environ[POLL_VARIABLE] == "1.5"
    assert os.environ[POLL_VARIABLE] == "1.5"


def test_a_ray_job_starts_its_trainer_with_the_quick_poll(monkeypatch, workdir):
    monkeypatch.delenv(POLL_VARIABLE, raising=False)
    seen = []

    def fit_trainer(trainer):
        seen.append(os.environ.get(POLL_VARIABLE))
        raise KeyboardInterrupt  # stop here: what the trainer would run with is known

    monkeypatch.setattr(runtime, "ray_session", lambda **_: contextlib.nullcontext())
    monkeypatch.setattr(runtime, "listings", lambda: None)
    monkeypatch.setattr(runtime, "torch_trainer", lambda *a, **k: None)
    monkeypatch.setattr(runtime, "fit_trainer", fit_trainer)
    with pytest.raises(KeyboardInterrupt):
        runtime.run_fit(lambda *a: None, {}, PretrainConfig(num_workers=2))
    assert seen == ["0.25"] and POLL_VARIABLE not in os.environ
