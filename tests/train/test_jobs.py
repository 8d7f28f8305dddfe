"""The job declarations: every job's command-line flags and default config are what they were before the shared
fields moved to one base config (``tests/train/jobs_before.json``, written from the code before), and a config
survives its dict round trip."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ropim.cli import job_commands, job_parser

BEFORE = json.loads(Path(__file__).with_name("jobs_before.json").read_text())


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_flags_and_defaults_are_unchanged(name):
    cls = job_commands()[name][0]
    help_text = job_parser(cls, name, "").format_help()
    assert sorted(set(re.findall(r"^\s+(--[\w.]+)", help_text, re.M))) == BEFORE[name]["flags"]
    assert json.loads(json.dumps(cls().to_dict())) == BEFORE[name]["defaults"]
    assert cls.from_dict(cls().to_dict()) == cls()
