"""The `ropim` command: presets are config files, flags apply in order, bad input is one line before anything heavy
is imported, and `ropim sweep`, `python -m tune.sweep` and `jobs/sweep.py` take the same flags."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import ROOT, pretrain_preset, run_cli, run_cli_in_one_process

from ropim.cli import PRESETS, shipped_presets

PRETRAIN = shipped_presets(PRESETS / "pretrain")


load = pretrain_preset


@pytest.mark.parametrize("name", list(PRETRAIN))
def test_preset_validates(name):
    load(name, "--data.source", "digits").validate()


def test_paper_presets():
    tiny = load("vit_tiny_in100")
    assert tiny.model.arch == "vit_tiny_patch16_224"
    assert (tiny.epochs, tiny.global_batch_size, tiny.base_lr) == (800, 512, 1e-3)
    for arch in ("small", "base"):
        cfg = load(f"vit_{arch}_in1k")
        assert cfg.model.arch == f"vit_{arch}_patch16_224"
        assert (cfg.epochs, cfg.global_batch_size, cfg.base_lr, cfg.warmup_epochs) == (300, 1520, 1.5e-4, 10)
    for name in PRETRAIN:
        cfg = load(name)
        assert cfg.model.rho == pytest.approx(1 / 7)
        paper = name.endswith(("_in1k", "_in100"))
        assert (cfg.model.backbone, cfg.model.init) == (("beit", "official") if paper else ("vit", "timm")), name
        assert cfg.model.n_tokens > 1 and cfg.model.img_size % cfg.model.patch_size == 0


def test_overrides_apply_in_order():
    cfg = load("vit_tiny_in100", "--model.rho", "0.25", "--num_workers", "4", "--accum_steps", "2")
    assert (cfg.model.rho, cfg.num_workers, cfg.accum_steps, cfg.epochs) == (0.25, 4, 2, 800)
    later = load("vit_tiny_in100", "--epochs", "3", "--preset", "digits_demo")
    assert later.epochs == load("digits_demo").epochs != 3  # the later preset wins


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model.rho", "1.5"], "rho=1.5"),
        (["--model.rho", "0"], "rho=0"),
        (["--model.img_size", "30", "--model.patch_size", "4"], "patch size must divide"),
        (["--model.arch", "vit_giant_patch99"], "arch='vit_giant_patch99'"),
        (["--model.backbone", "swin"], "backbone='swin'"),
        (["--model.init", "official"], "model.init='official'"),
        (["--global_batch_size", "10", "--num_workers", "3"], "not divisible by num_workers=3"),
        (["--global_batch_size", "64", "--num_workers", "0", "--accum_steps", "3"],
         "global_batch_size=64 is not divisible by accum_steps=3"),  # no worker count of 0 in the product
        (["--min_lr", "1"], "min_lr=1.0 is above the peak learning rate"),
        (["--preset", "nope"], "unknown --preset 'nope'"),
    ],
)
def test_bad_input_is_one_line_before_ray(args, message, tmp_path):
    proc = run_cli("pretrain", "--preset", "digits_demo", *args, cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Ray" not in proc.stdout + proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_unreachable_mlflow_server_fails_before_ray(tmp_path):
    proc = run_cli("pretrain", "--preset", "digits_demo", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"},
                   cwd=tmp_path)
    assert proc.returncode != 0
    assert "MLflow server unreachable" in proc.stderr and "http://127.0.0.1:9" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr


def test_parsing_and_bad_input_import_no_torch_ray_or_mlflow(tmp_path):
    """`ropim --help`, `ropim pretrain --help`, config errors (a sweep's too), a training split smaller than a batch
    (Parquet counted with pyarrow, the built-in digits from their labels) and a registered encoder looked up in a
    store that does not exist yet, a local encoder folder that is not there or does not fit the job (its config.json:
    input channels, patch size, depth) answer without the heavy libraries."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from support import encoder_folder

    from ropim.core.config import ModelConfig

    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"image": [b"x"] * 100, "label": pa.array([0, 1] * 50, pa.int64()),
                             "path": [f"{i}.png" for i in range(100)]}), shards / "part-0.parquet")
    encoder_folder(tmp_path / "enc8", ModelConfig(img_size=32, patch_size=8, depth=1))
    encoder_folder(tmp_path / "gray", ModelConfig(img_size=32, patch_size=4, depth=1, in_chans=1))
    argvs = [["--help"], ["pretrain", "--help"], ["sweep", "--help"], ["pretrain", "--model.rho", "2"],
             ["sweep", "--space", '{"rho": {"grid": [0.1, 1.5]}}'], ["sweep", "--name", "../x"],
             ["pretrain", "--data.source", str(shards), "--global_batch_size", "4096"],
             ["sweep", "--data.source", str(shards), "--metric", "finetune_top1", "--finetune.batch_size", "4096"],
             ["pretrain", "--preset", "digits_demo", "--global_batch_size", "4096"],
             ["finetune", "--preset", "digits_demo", "--encoder", "models:/ropim-encoder@champion"],
             ["models", "show", "models:/ropim-encoder/3"],
             ["graft", "--preset", "digits_demo", "--encoder", "enc8", "--lower_blocks", "2"],
             ["segment", "--preset", "digits_seg", "--encoder", "enc8", "--crop_size", "60"],
             ["finetune", "--preset", "digits_demo", "--encoder", "no/such/folder"],
             ["probe", "--encoder", "gray"], ["segment", "--preset", "digits_seg", "--encoder", "gray"],
             ["finetune", "--preset", "digits_demo", "--encoder", "enc8", "--img_size", "60"]]
    proc = run_cli_in_one_process(argvs, ("torch", "ray", "mlflow", "timm"), tmp_path, timeout=120)
    out = proc.stdout + proc.stderr
    assert "HEAVY []" in out, out[-3000:]
    assert "EXIT ropim pretrain: global_batch_size=4096 exceeds the training split (" in out
    assert "EXIT ropim sweep: finetune.batch_size=4096 exceeds the training split (" in out
    assert "EXIT ropim pretrain: global_batch_size=4096 exceeds the training split (1438 images)" in out
    assert "no alias 'champion' on model 'ropim-encoder': the tracking store sqlite:///" in out
    assert "models:/ropim-encoder/3: no such registered version: the tracking store" in out
    assert not (tmp_path / "mlflow.db").exists()  # a lookup in a store that is not there does not create it
    assert "lower_blocks=2: the encoder " in out and "has 1 block" in out
    assert "crop_size=60: encoder " in out and "enc8 has patch size 8, which must divide the crop size" in out
    assert "EXIT ropim finetune: encoder no/such/folder: no such local folder" in out
    assert "EXIT ropim probe: encoder gray expects 1-channel images (in_chans=1), and every data source gives" in out
    assert "EXIT ropim segment: encoder " in out and "gray expects 1-channel images (in_chans=1)" in out
    assert "EXIT ropim finetune: img_size=60: encoder " in out and "enc8 has patch size 8, which must divide" in out


def test_presets_list_and_print_config(tmp_path):
    listed = run_cli("presets").stdout
    assert "pretrain/digits_demo" in listed and "demo/digits_demo" in listed and "sweep/rho_ablation" in listed
    printed = run_cli("pretrain", "--preset", "digits_demo", "--model.rho", "0.25", "--print_config").stdout
    assert "rho: 0.25" in printed and "depth: 6" in printed
    user = tmp_path / "mine.yaml"
    user.write_text(json.dumps({"epochs": 3, "model": {"rho": 0.5}}))
    printed = run_cli("pretrain", "--preset", "digits_demo", "--config", str(user), "--print_config").stdout
    assert "epochs: 3" in printed and "rho: 0.5" in printed and "depth: 6" in printed


def test_sweep_takes_the_same_flags_everywhere():
    argv = ["--preset", "tpe", "--num-samples", "5", "--workers-per-trial", "1", "--model.depth", "2", "--name", "x",
            "--print_config"]
    outputs = [run_cli("sweep", *argv),
               subprocess.run([sys.executable, "-m", "tune.sweep", *argv], capture_output=True, text=True, cwd=ROOT),
               subprocess.run([sys.executable, "jobs/sweep.py", *argv], capture_output=True, text=True, cwd=ROOT)]
    for proc in outputs:
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert outputs[0].stdout == outputs[1].stdout == outputs[2].stdout
    assert "num_samples: 5" in outputs[0].stdout and "search: tpe" in outputs[0].stdout


def test_an_empty_config_file_is_an_empty_config_and_flag_values_parse_as_before(tmp_path):
    for text in ("", "\n\n", "# nothing here yet\n"):
        (tmp_path / "empty.yaml").write_text(text)
        assert load("digits_demo", "--config", str(tmp_path / "empty.yaml")) == load("digits_demo")
    cfg = load("digits_demo", "--run_name", "", "--clip_grad", "null", "--model.rho", "0.25", "--epochs", "3")
    assert (cfg.run_name, cfg.clip_grad, cfg.model.rho, cfg.epochs) == ("", None, 0.25, 3)


def test_a_key_given_twice_in_a_config_file_is_refused_naming_it_and_its_lines(tmp_path):
    from ropim.errors import ConfigError

    (tmp_path / "twice.yaml").write_text("epochs: 2\ndata:\n  source: a\n  val_fraction: 0.1\n  source: b\n")
    with pytest.raises(ConfigError, match=r"twice.yaml: key 'data.source' is given twice \(lines 3 and 5\)"):
        load("digits_demo", "--config", str(tmp_path / "twice.yaml"))
    (tmp_path / "lists.yaml").write_text("epochs: 2\nmodel:\n  rho: 0.2\nseed: 1\n")  # the same name, other mappings
    assert load("digits_demo", "--config", str(tmp_path / "lists.yaml")).model.rho == 0.2


def test_a_file_given_to_a_nested_config_flag_follows_the_same_rules(tmp_path):
    from ropim.errors import ConfigError

    (tmp_path / "model.yaml").write_text("rho: 0.2\nrho: 0.3\n")  # --model FILE: jsonargparse gives no path
    with pytest.raises(ConfigError, match=r"key 'rho' is given twice \(lines 1 and 2\); keep one"):
        load("digits_demo", "--model", str(tmp_path / "model.yaml"))
    (tmp_path / "data.yaml").write_text("")
    assert load("digits_demo", "--data", str(tmp_path / "data.yaml")) == load("digits_demo")
    (tmp_path / "data.yaml").write_text("val_fraction: 0.3\n")
    assert load("digits_demo", "--data", str(tmp_path / "data.yaml")).data.val_fraction == 0.3
