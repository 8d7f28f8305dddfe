"""`ropim demo`, the README's main job, end to end at a tiny budget: pretrain on two Ray workers -> register ->
kNN, linear probe and fine-tune of the encoder and of a random-init one -> the summary; no config validated twice."""

from __future__ import annotations

import json

import pytest

from ropim.cli import main
from ropim.tracking import store
from ropim.train.job import JobConfig

TINY = ["--pretrain.epochs", "1", "--pretrain.max_steps_per_epoch", "2", "--pretrain.viz_every", "0",
        "--finetune.epochs", "1", "--finetune.max_steps_per_epoch", "2"]


@pytest.mark.slow  # a pretraining on Ray and two fine-tunes (the README's make demo runs the full budget)
def test_demo_prints_both_encoders_scores_and_registers_them(workdir, ray_session, monkeypatch, capsys):
    validated, validate = [], JobConfig.validate

    def recorded(self):
        validated.append((type(self).__name__, json.dumps(self.to_dict(), sort_keys=True, default=str)))
        return validate(self)

    monkeypatch.setattr(JobConfig, "validate", recorded)
    main(["demo", *TINY])
    out = capsys.readouterr().out
    assert "== ROPIM demo: digits val split, top-1 (%)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("ROPIM (pretrained here)", "random init"))]
    assert len(rows) == 2 and all(0 <= float(v) <= 100 for row in rows for v in row[-3:])  # kNN, probe, fine-tune
    assert "registered encoder:    models:/ropim-encoder/1" in out
    assert "registered classifier: models:/ropim-classifier/1" in out
    c = store.client()
    assert c.get_model_version("ropim-encoder", "1").status == "READY"
    assert [kind for kind, _ in validated] == ["FinetuneConfig", "PretrainConfig", "FinetuneConfig", "FinetuneConfig"]
    assert len(set(validated)) == len(validated)  # the pretraining once; the fine-tune as typed, then each run's
