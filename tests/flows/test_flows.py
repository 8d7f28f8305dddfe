"""The composed commands: `ropim probe` (linear probe + kNN at another resolution, logged and tagged, features
cached) and `ropim transfer` (one table over encoders, preflight before any run)."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image
from support import encoder_folder, register_tiny_encoder, tiny_finetune

from ropim.console import Pace
from ropim.data.config import DataConfig, SegDataConfig
from ropim.errors import ConfigError
from ropim.flows import probe as probe_flow
from ropim.flows import transfer as transfer_flow
from ropim.flows.config import ProbeConfig, TransferConfig
from ropim.flows.probe import probe
from ropim.flows.transfer import transfer
from ropim.tracking import store
from ropim.train.segment.config import SegmentConfig


@pytest.fixture(scope="module")
def encoder(workdir):
    return register_tiny_encoder(workdir)


def test_probe_at_another_resolution_logs_and_tags(workdir, encoder, caplog, monkeypatch):
    uri, _ = encoder
    monkeypatch.setattr(probe_flow, "Pace", functools.partial(Pace, every=0.0))  # a progress line per batch
    with caplog.at_level(logging.INFO, logger="ropim"):
        res = probe(ProbeConfig(encoder=uri, img_size=48, cache_dir=str(workdir / "feats"), linear_max_iter=200))
    assert "from a 8x8 to a 12x12 grid" in caplog.text
    assert re.search(r"\[probe\] train features: 256/1438 images [\d.]+ img/s ETA", caplog.text)  # 256 a batch
    assert res["linear"]["top1"] > 25 and res["knn"]["top1"] > 25  # 10 classes: chance is 10
    c = store.client()
    tags = c.get_model_version("ropim-encoder", "1").tags
    assert tags["downstream.digits.linear_top1"] == f"{res['linear']['top1']:.2f}"
    assert tags["downstream.digits.knn_top1"] == f"{res['knn']['top1']:.2f}"
    assert {"linear_confusion.png", "knn_confusion.png"} <= {a.path for a in c.list_artifacts(res["run_id"])}
    assert len(list((workdir / "feats").glob("features-*.safetensors"))) == 1
    again = probe(ProbeConfig(encoder=uri, img_size=48, cache_dir=str(workdir / "feats"), linear_max_iter=200))
    assert again["linear"]["top1"] == res["linear"]["top1"]  # same cached features, same seeded probe


def write_split_folder(root, classes: str, seed: int) -> None:
    """An ImageFolder with its own split: root/{train,val}/<class>/<i>.png, 16x16 noise."""
    for split, n in (("train", 4), ("val", 2)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                pixels = np.random.default_rng([seed, c, i, n]).integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")


def test_probe_cache_follows_the_data(workdir, encoder, monkeypatch):
    """Cached features are read back only while the images are the same: an image rewritten in place (same path)
    or a class added extracts them again."""
    uri, _ = encoder
    root, extracted = workdir / "tvc", []
    write_split_folder(root, "ab", seed=0)
    real = probe_flow.extract_features
    monkeypatch.setattr(probe_flow, "extract_features", lambda *a, **k: extracted.append(1) or real(*a, **k))
    cfg = ProbeConfig(encoder=uri, data=DataConfig(source=str(root)), cache_dir=str(workdir / "feats-tvc"), knn_k=3,
                      linear_max_iter=50)
    probe(cfg)
    probe(cfg)
    assert len(extracted) == 2  # train and val once, then from the cache
    image = root / "train" / "a" / "0.png"
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(image)
    os.utime(image, ns=(image.stat().st_atime_ns, image.stat().st_mtime_ns + 10**9))
    probe(cfg)
    assert len(extracted) == 4
    write_split_folder(root, "abc", seed=0)
    probe(cfg)
    assert len(extracted) == 6 and len(list((workdir / "feats-tvc").glob("features-*.safetensors"))) == 3


def test_cli_probe_lists_its_data_once_and_reads_the_cache_back(workdir, encoder, monkeypatch, capsys):
    """`ropim probe` with relative paths, twice: the second reads the cached features. The probe lists the folder
    once for both splits (it listed it once per split: at ImageNet scale each listing walks 1.28M files); the
    pre-flight's decode check walks only as far as its first training images (it listed the whole folder too)."""
    from ropim.cli import main as cli_main
    from ropim.data.formats import imagefolder

    write_split_folder(workdir / "pics-rel", "ab", seed=3)
    listings, extracted, real = [], [], imagefolder.source
    monkeypatch.setattr(imagefolder, "source", lambda *a, **k: listings.append(1) or real(*a, **k))
    real_extract = probe_flow.extract_features
    monkeypatch.setattr(probe_flow, "extract_features", lambda *a, **k: extracted.append(1) or real_extract(*a, **k))
    argv = ["probe", "--encoder", "enc-local", "--data.source", "pics-rel", "--cache_dir", "feats-rel",
            "--knn_k", "3", "--linear_max_iter", "50"]
    cli_main(argv)
    assert len(extracted) == 2 and len(listings) == 1, listings  # the probe's one listing
    cli_main(argv)
    assert len(extracted) == 2 and len(list((workdir / "feats-rel").glob("features-*.safetensors"))) == 1
    assert capsys.readouterr().out.count("linear top-1") >= 2


@pytest.mark.slow  # two encoders probed (12 s); make test transfers one, with segmentation beside it
def test_transfer_table_over_encoders(workdir, encoder):
    uri, folder = encoder
    other = encoder_folder(workdir / "enc-other", seed=1)
    out = workdir / "transfer"
    res = transfer(TransferConfig(encoders=f"{uri},{other}", data="digits", mode="probe",
                                  probe=ProbeConfig(linear_max_iter=200), out=str(out)))
    assert [r["encoder_label"] for r in res["rows"]] == ["ropim-encoder v1", str(other)]
    md = (out / "transfer.md").read_text()
    assert "| encoder | digits | mean |" in md and "| ropim-encoder v1 |" in md and "kNN (k=20)" in md
    rows = (out / "transfer.csv").read_text().strip().splitlines()
    assert rows[0] == "encoder,digits,mean" and len(rows) == 3
    assert len(json.loads((out / "transfer.json").read_text())["rows"]) == 2
    c = store.client()
    n_runs = len(c.search_runs([c.get_experiment_by_name("ropim-probe").experiment_id]))
    with pytest.raises(LookupError, match="no alias 'nope'"):  # the bad second encoder stops it before any run
        transfer(TransferConfig(encoders=f"{uri},models:/ropim-encoder@nope", data="digits", mode="probe"))
    assert len(c.search_runs([c.get_experiment_by_name("ropim-probe").experiment_id])) == n_runs




def test_transfer_runs_every_cell_on_the_version_an_alias_held_at_its_start(workdir, encoder, monkeypatch):
    """A sweep promotes another version while a transfer runs: its cells keep the version the pre-flight pinned
    (before: each cell looked the alias up again, one row mixing versions under the first one's label)."""
    from safetensors.torch import load_file

    from ropim.tracking import registry

    _, folder = encoder
    c = store.client()
    before = c.get_model_version_by_alias("ropim-encoder", "champion").version
    run_id = store.create_run("ropim-pretrain", "tiny-2", {})
    registry.register_encoder(run_id, load_file(str(folder / "encoder.safetensors")),
                              json.loads((folder / "config.json").read_text()))
    store.end_run(run_id)
    newer = max(int(v.version) for v in c.search_model_versions("name='ropim-encoder'"))
    real = transfer_flow.preflight

    def promoted_meanwhile(cfg):
        refs = real(cfg)
        c.set_registered_model_alias("ropim-encoder", "champion", str(newer))
        return refs

    monkeypatch.setattr(transfer_flow, "preflight", promoted_meanwhile)
    try:
        res = transfer(TransferConfig(encoders="models:/ropim-encoder@champion", data="digits", mode="probe",
                                      probe=ProbeConfig(linear_max_iter=20), out="pinned-table"))
    finally:
        c.set_registered_model_alias("ropim-encoder", "champion", before)
    assert [r["encoder_label"] for r in res["rows"]] == [f"ropim-encoder v{before}"]


def test_transfer_lists_each_data_source_once_for_every_cell(workdir, encoder, monkeypatch):
    """Two encoders probed on one ImageFolder: its pre-flight and both cells share one listing (before: one for the
    pre-flight and one per cell, 4 walks of the whole tree)."""
    from ropim.data.formats import imagefolder

    uri, _ = encoder
    for c in ("a", "b"):
        (workdir / "pics" / c).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(np.random.default_rng(i + 50 * (c == "b")).integers(0, 256, (8, 8, 3), np.uint8)).save(
                workdir / "pics" / c / f"{i}.png")
    calls, real = [], imagefolder.source
    monkeypatch.setattr(imagefolder, "source", lambda cfg, *a: calls.append(cfg.source) or real(cfg, *a))
    res = transfer(TransferConfig(encoders=f"{uri},{encoder_folder(workdir / 'enc-b', seed=2)}", data="pics",
                                  mode="probe", probe=ProbeConfig(linear_max_iter=20, knn_k=5), out="pics-table"))
    assert len(res["rows"]) == 2 and calls == [str(workdir / "pics")]


def test_transfer_puts_segmentation_beside_classification(workdir, encoder):
    uri, _ = encoder
    seg = SegmentConfig(data=SegDataConfig(canvases=20, canvas_size=32), crop_size=32, epochs=1, batch_size=2,
                        max_steps_per_epoch=1, channels=8, aux_channels=8, num_workers=0, viz_images=0,
                        registered_model="")
    out = workdir / "transfer-seg"
    res = transfer(TransferConfig(encoders=uri, data="digits", mode="probe", probe=ProbeConfig(linear_max_iter=50),
                                  segment_data="digits", segment=seg, out=str(out)))
    assert [r.get("task", "classify") for r in res["rows"]] == ["classify", "segment"]
    rows = (out / "transfer.csv").read_text().strip().splitlines()
    assert rows[0] == "encoder,digits,mean,digits mIoU" and rows[1].startswith("ropim-encoder v1,")
    assert f"{res['rows'][1]['miou']:.2f}" == rows[1].split(",")[-1]
    md = (out / "transfer.md").read_text()
    assert "linear-probe top-1 (%) and segmentation mIoU (%)" in md
    knn = md.split("kNN (k=20) top-1 (%)")[1]  # the probe's kNN, not blanked by the segmentation row of its data
    assert f"| ropim-encoder v1 | {res['rows'][0]['knn_top1']:.2f} |" in knn and "—" not in knn
    with pytest.raises(ConfigError, match="crop_size=30"):  # checked before any cell runs
        transfer(TransferConfig(encoders=uri, segment_data="digits", segment=replace(seg, crop_size=30)))


def test_transfer_checks_out_before_any_cell(workdir, encoder, monkeypatch):
    """An --out that is a file, lies under a file, holds a folder where a table goes, or cannot be written is
    refused in pre-flight, before any cell's run (not after every cell has run)."""
    uri, _ = encoder
    cells = []
    monkeypatch.setattr(transfer_flow, "probe", lambda cell: cells.append(cell))
    (workdir / "out-file").write_text("x")
    (workdir / "out-taken" / "transfer.csv").mkdir(parents=True)
    for out, match in ((workdir / "out-file", "is a file, not a folder"),
                       (workdir / "out-file" / "sub", "cannot be created: .*out-file is a file"),
                       (workdir / "out-taken", "holds a folder named transfer.csv")):
        with pytest.raises(ConfigError, match=f"--out '{out}' {match}"):
            transfer(TransferConfig(encoders=uri, data="digits", mode="probe", out=str(out)))
    monkeypatch.setattr("ropim.checks.os.access", lambda path, mode: False)
    with pytest.raises(ConfigError, match="--out .*new/table': the folder cannot be created in .* not writable"):
        transfer(TransferConfig(encoders=uri, data="digits", mode="probe", out=str(workdir / "new" / "table")))
    assert cells == [] and not (workdir / "new").exists()


def test_transfer_again_reports_its_finished_fine_tunes(workdir, encoder, capsys):
    """A fine-tune cell's run is named for what it computes: the same transfer again (after a stop, or to add a data
    set) trains nothing it finished; another seed is another cell."""
    uri, _ = encoder
    cfg = TransferConfig(encoders=uri, data="digits", mode="finetune", out="again",
                         finetune=tiny_finetune("", epochs=1, num_workers=0, registered_model=""))
    first = transfer(cfg)["rows"][0]
    assert "already finished" not in capsys.readouterr().out
    again = transfer(cfg)["rows"][0]
    assert "already finished" in capsys.readouterr().out
    assert (again["run_id"], again["top1"]) == (first["run_id"], first["top1"])
    other = transfer(replace(cfg, finetune=replace(cfg.finetune, seed=cfg.finetune.seed + 1)))["rows"][0]
    assert other["run_id"] != first["run_id"] and "already finished" not in capsys.readouterr().out
