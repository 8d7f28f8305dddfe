"""The job declarations: every job's command-line flags and default config are what they were before the shared
fields moved to one base config (``tests/train/jobs_before.json``, written from the code before), a config survives
its dict round trip, a job's config is validated once per process, a flag reaches the model through at most five
modules, and every job has its ``jobs/`` entry."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
from pathlib import Path

import pytest
from support import ROOT, encoder_folder
from torch.utils.data import DataLoader

from ropim.cli import job_commands, job_parser, main
from ropim.core.model import ROPIM
from ropim.tracking import store
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.jobs import JOBS
from ropim.train.pretrain.config import PretrainConfig

BEFORE = json.loads(Path(__file__).with_name("jobs_before.json").read_text())
# fields added since, on purpose, with defaults that keep the old behaviour: pretraining's DataLoader processes;
# every job's data.follow_links (links out of an ImageFolder or a folder pair's root stay unfollowed); the kNN /
# probe evaluation's train sample of pretraining and graft (None: the whole train split); fine-tuning's and
# segmentation's gradient accumulation (1: none), which pretraining and graft had
ADDED = {name: {"data.follow_links": False, **({"dataloader_workers": 0} if name == "pretrain" else {}),
                **({"eval_train_images": None} if name in ("pretrain", "graft") else {}),
                **({"accum_steps": 1} if name in ("finetune", "segment") else {})}
         for name in BEFORE}


def with_added(defaults: dict, added: dict) -> dict:
    """``defaults`` with the ``added`` fields (dotted keys reach into a section)."""
    out = json.loads(json.dumps(defaults))
    for key, value in added.items():
        *sections, field = key.split(".")
        node = out
        for section in sections:
            node = node[section]
        node[field] = value
    return out


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_flags_and_defaults_are_unchanged(name):
    cls = job_commands()[name][0]
    help_text = job_parser(cls, name, "").format_help()
    added = ADDED.get(name, {})
    assert sorted(set(re.findall(r"^\s+(--[\w.]+)", help_text, re.M))) == sorted(
        BEFORE[name]["flags"] + [f"--{k}" for k in added])
    assert json.loads(json.dumps(cls().to_dict())) == with_added(BEFORE[name]["defaults"], added)
    assert cls.from_dict(cls().to_dict()) == cls()


def test_a_job_validates_its_config_once(workdir, monkeypatch, capsys):
    """`ropim finetune …` in this process: the pre-flight and the run share one ``prepare``, so the config is
    validated exactly once (before, the command and the job each validated it)."""
    calls = []
    validate = FinetuneConfig.validate

    def counted(self):
        calls.append(self.run_name)
        return validate(self)

    monkeypatch.setattr(FinetuneConfig, "validate", counted)
    enc = str(encoder_folder(workdir / "enc"))
    main(["finetune", "--encoder", enc, "--num_workers", "0", "--epochs", "1", "--batch_size", "16",
          "--max_steps_per_epoch", "1", "--mixup", "0", "--cutmix", "0", "--registered_model", "",
          "--run_name", "once"])
    assert calls == ["once"]
    assert capsys.readouterr().out.splitlines()[-1].startswith("top-1 ")


@pytest.fixture(scope="module")
def pretrained(workdir):
    """One tiny in-process `ropim pretrain --model.rho 0.3 --dataloader_workers 1 --registered_model ""`, watched:
    its printed lines, each validation of its config, the ropim modules on the call stack when the model is built,
    and the processes of each DataLoader made."""
    seen = {"validated": [], "built": [], "loaders": []}
    validate, build, load = PretrainConfig.validate, ROPIM.__init__, DataLoader.__init__

    def counted(self):
        seen["validated"].append(inspect.stack()[1].frame.f_globals["__name__"])
        return validate(self)

    def watched(self, cfg):
        seen["built"].append((cfg.rho, [f.frame.f_globals["__name__"] for f in inspect.stack()[1:]]))
        build(self, cfg)

    def loader(self, *args, **kwargs):
        seen["loaders"].append(kwargs.get("num_workers", 0))
        load(self, *args, **kwargs)

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.setattr(PretrainConfig, "validate", counted)
        patch.setattr(ROPIM, "__init__", watched)
        patch.setattr(DataLoader, "__init__", loader)
        main(["pretrain", "--preset", "digits_demo", "--num_workers", "0", "--model.depth", "1", "--epochs", "1",
              "--model.rho", "0.3", "--global_batch_size", "16", "--max_steps_per_epoch", "1", "--viz_every", "0",
              "--dataloader_workers", "1", "--registered_model", "", "--run_name", "unregistered"])
    return {**seen, "said": out.getvalue().splitlines()}


def test_an_empty_registered_model_registers_nothing_for_pretraining_too(workdir, pretrained):
    """`ropim pretrain --registered_model ""`: "" means "do not register" for every job (the driver's rule); before,
    pretraining trained to the end and died in MLflow's `Missing value for required parameter 'name'`."""
    folder = workdir / "ray_results" / "unregistered" / "in_process" / "checkpoint_000001"
    assert pretrained["said"][-2:] == [f"[pretrain] finished, nothing registered: {folder}", str(folder)]
    c = store.client()
    run = c.search_runs([c.get_experiment_by_name("ropim-pretrain").experiment_id], "attributes.run_name = "
                        "'unregistered'")[0]
    assert run.info.status == "FINISHED" and not c.search_model_versions(f"run_id='{run.info.run_id}'")


def test_pretraining_decodes_in_the_dataloader_processes_it_is_given(pretrained):
    """`--dataloader_workers`, before only the encoder jobs', reaches pretraining's training DataLoader too."""
    assert pretrained["loaders"][0] == 1


def test_a_flag_reaches_the_model_through_at_most_five_modules(pretrained):
    """`--model.rho 0.3` from the command line (``ropim.cli`` and its commands) to the model (``ropim.core.model``):
    the modules it crosses are the one that validates it (once) and those on the call stack that builds the model
    (in-process; under Ray the worker's stack holds the same loop, task and model)."""
    assert pretrained["validated"] == ["ropim.train.jobs"]
    [(rho, stack)] = pretrained["built"]
    assert rho == 0.3
    start = stack.index("ropim.cli")
    crossed = dict.fromkeys(pretrained["validated"] + [m for m in reversed(stack[:start]) if m.startswith("ropim.")])
    crossed = [m for m in crossed if m not in ("ropim.cli", "ropim.commands")]
    assert len(crossed) <= 5, crossed
    assert crossed[-1] == "ropim.train.pretrain.task", crossed


def test_every_job_has_its_ray_job_entry():
    for job in JOBS.values():
        entry = ROOT / job.entry
        assert entry.is_file() and f"`ropim {job.name}`" in entry.read_text()
        assert job.experiment == f"ropim-{job.name}"


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_flag_says_what_it_does(name):
    """`ropim <job> --help` explains every flag: each config field's docstring is its help (no bare "(type: …)")."""
    help_text = job_parser(job_commands()[name][0], name, "").format_help()
    entries = re.split(r"\n  (?=--)", help_text.split("\noptions:\n", 1)[1])
    bare = [e.split()[0] for e in entries if re.match(r"--[\w.]+ +\S+\s+\(type:", e) or
            re.match(r"--[\w.]+ \{true,false\}\s+\(type:", e)]
    assert len(entries) > 40 and not bare, bare
