"""What `ropim finetune` and `ropim segment` say and record, in this process with ``--eval_every 2`` over 2 epochs
and nothing registered: an epoch line for every epoch (the val scores on the evaluated one; before, an epoch not
evaluated printed nothing, and the first line's one-off peak memory waited for an evaluated epoch), the
``bad_images`` epoch statistic (before: never recorded by a fine-tune) and, as the last line, the scores with the
checkpoint the run keeps (before: "classifier None" / "segmenter None")."""

from __future__ import annotations

import contextlib
import io
import logging
import re

import pytest
from support import encoder_folder

from ropim.cli import main
from ropim.core.config import ModelConfig
from ropim.tracking import store

TWO_EPOCHS = ["--epochs", "2", "--eval_every", "2", "--max_steps_per_epoch", "2", "--num_workers", "0",
              "--registered_model", ""]
JOBS = {
    "finetune": ["--preset", "digits_demo", "--batch_size", "16"],
    "segment": ["--preset", "digits_seg", "--data.canvases", "20", "--data.canvas_size", "32", "--crop_size", "32",
                "--batch_size", "2", "--channels", "8", "--aux_channels", "8", "--viz_images", "0"],
}
SCORES = {"finetune": r"top-1 [\d.]+%  top-5 [\d.]+%  classifier",
          "segment": r"mIoU [\d.]+%  pixel accuracy [\d.]+%  segmenter"}
VAL = {"finetune": r"val top1 [\d.]+% top5 [\d.]+%", "segment": r"val miou [\d.]+% pixel_acc [\d.]+%"}


class Lines(logging.Handler):
    """The messages of the log records it is handed."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module", params=sorted(JOBS))
def ran(request, workdir) -> dict:
    """`ropim JOB` of 2 epochs, the second alone evaluated, from a local encoder folder: its job, printed lines,
    logged lines and MLflow run id."""
    job = request.param
    enc = encoder_folder(workdir / "enc", ModelConfig(img_size=32, patch_size=8, depth=2))
    logger, lines, out = logging.getLogger("ropim"), Lines(), io.StringIO()
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(out):
            main([job, "--encoder", str(enc), *JOBS[job], *TWO_EPOCHS, "--run_name", f"{job}-lines"])
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    c = store.client()
    run = c.search_runs([c.get_experiment_by_name(f"ropim-{job}").experiment_id],
                        f"attributes.run_name = '{job}-lines'")[0]
    return {"job": job, "said": out.getvalue().splitlines(), "logged": lines.lines, "run_id": run.info.run_id}


def test_every_epoch_has_its_line_with_the_val_scores_on_the_evaluated_one(ran):
    job = ran["job"]
    epochs = [line for line in ran["logged"] if line.startswith(f"[{job}] epoch ") and " img/s " in line]
    assert len(epochs) == 2, ran["logged"]
    first, second = epochs
    assert re.match(rf"\[{job}\] epoch 1/2 train loss [\d.]+ [\d.]+ img/s ", first), first
    assert "val" not in first and "peak RSS per worker" in first  # the one-off note on the job's first line
    assert re.match(rf"\[{job}\] epoch 2/2 train loss [\d.]+ {VAL[job]} [\d.]+ img/s ", second), second


def test_the_epochs_record_the_bad_images_they_skipped(ran):
    history = store.client().get_metric_history(ran["run_id"], "bad_images")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.0), (2, 0.0)]


def test_the_last_line_names_the_checkpoint_kept_when_nothing_is_registered(ran, workdir):
    job, said = ran["job"], ran["said"]
    folder = workdir / "ray_results" / f"{job}-lines" / "in_process" / "checkpoint_000002"
    assert said[-2] == f"[{job}] finished, nothing registered: {folder}"
    assert re.fullmatch(rf"{SCORES[job]} not registered: {re.escape(str(folder))}  \(MLflow run {ran['run_id']}\)",
                        said[-1]), said[-1]
    assert folder.is_dir()
