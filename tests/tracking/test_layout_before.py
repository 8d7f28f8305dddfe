"""An encoder registered before the one job framework (issue 31) still serves: a stored fixture of what the code of
then registered (``fixtures/encoder_before_issue31.json``: every file of the version, its tags and description, the
source run) is registered again as it was, then shown and fine-tuned by today's commands."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from ropim.cli import main
from ropim.tracking import store

FIXTURE = Path(__file__).with_name("fixtures") / "encoder_before_issue31.json"


def write_files(files: dict, folder: Path) -> None:
    """The version's files; the weights file from its stored header, the values drawn (the layout is the header)."""
    rng = np.random.default_rng(0)
    for rel, stored in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if "text" in stored:
            path.write_text(stored["text"])
            continue
        header = stored["safetensors_header"].encode()
        tensors = {k: v for k, v in json.loads(header).items() if k != "__metadata__"}
        assert {t["dtype"] for t in tensors.values()} == {"F32"}
        values = rng.normal(0, 0.02, (stored["size"] - 8 - len(header)) // 4).astype("<f4")
        path.write_bytes(struct.pack("<Q", len(header)) + header + values.tobytes())


@pytest.fixture(scope="module")
def encoder_before(workdir) -> str:
    """The fixture's version registered as the code before issue 31 registered it: a logged model of the pretraining
    run holding its files, version 1 of ropim-encoder with its tags and description; its URI."""
    before = json.loads(FIXTURE.read_text())
    c = store.client()
    run_id = store.create_run(before["experiment"], before["run_name"], before["run_params"], before["run_tags"])
    store.end_run(run_id)
    model = c.create_logged_model(c.get_run(run_id).info.experiment_id, name="encoder", source_run_id=run_id)
    write_files(before["files"], workdir / "before")
    c.log_model_artifacts(model.model_id, str(workdir / "before"))
    c.finalize_logged_model(model.model_id, "READY")
    c.create_registered_model("ropim-encoder")
    tags = {**before["version_tags"], "run_id": run_id}
    version = c.create_model_version("ropim-encoder", f"models:/{model.model_id}", run_id=run_id, tags=tags,
                                     description=before["description"], model_id=model.model_id)
    assert "kind" not in version.tags  # the layout of then: no kind tag on a version
    return f"models:/ropim-encoder/{version.version}"


def test_an_encoder_registered_before_is_shown_and_fine_tuned(encoder_before, capsys):
    main(["models", "show", encoder_before])
    assert "# ropim-encoder v1" in capsys.readouterr().out
    main(["finetune", "--encoder", encoder_before, "--num_workers", "0", "--epochs", "1", "--batch_size", "16",
          "--max_steps_per_epoch", "2", "--mixup", "0", "--cutmix", "0", "--run_name", "from-before"])
    said = capsys.readouterr().out.splitlines()
    assert said[-1].startswith("top-1 ") and "classifier models:/ropim-classifier/1" in said[-1], said[-3:]
    version = store.client().get_model_version("ropim-classifier", "1")
    assert version.tags["encoder_uri"] == encoder_before and version.tags["kind"] == "classifier"
