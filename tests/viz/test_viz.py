"""The pictures: reconstruction grids (paper Figs. 3/6/7), `ropim viz` from a checkpoint or a registered encoder,
and Figure 5, on a tiny ViT at 32×32."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import save_file
from support import gen
from support import make_model as make_cfg_model

from ropim.core.config import ModelConfig
from ropim.core.model import ROPIM, patchify
from ropim.data.config import DataConfig
from ropim.data.datasets import validation_images
from ropim.errors import ConfigError
from ropim.viz.command import DECODER_ARTIFACT, decoder_state, load_registered_model, run_viz
from ropim.viz.config import VizConfig
from ropim.viz.figure5 import token_errors
from ropim.viz.grids import grid_size, reconstruction_grid, save_reconstruction_grid

CFG = ModelConfig(img_size=32, patch_size=4, depth=2, corruption="mask")
P, N, B = 4, 64, 3


def make_model(**changes) -> ROPIM:
    return make_cfg_model(CFG, **changes)


@pytest.fixture(scope="module")
def imgs() -> torch.Tensor:
    return torch.randn(B, 3, 32, 32, generator=gen(1))



# ---------------------------------------------------------------- pictures


@pytest.mark.parametrize(("corruption", "columns"), [("rop", 5), ("mask", 5), ("none", 2)])
def test_reconstruction_grid_size_and_mode(tmp_path, corruption, columns):
    m = make_model(corruption=corruption).train()
    x = validation_images(DataConfig(), 32, 4)
    img = reconstruction_grid(m, x, gen(0))
    assert img.mode == "RGB" and img.size == grid_size(4, columns, 32)
    assert m.training  # mode restored
    path = save_reconstruction_grid(m, x, tmp_path / "sub" / "grid.png", gen(0), scale=2)
    with Image.open(path) as png:
        assert png.format == "PNG" and png.size == grid_size(4, columns, 32, 2)
    # the same generator seed gives the same picture
    assert reconstruction_grid(m, x, gen(0)).tobytes() == img.tobytes()


def test_rop_columns_add_up_to_the_original():
    """ΠX + (I−Π)X = X: the sketch and complement columns of a perfect predictor rebuild the image."""
    from ropim.core.model import unpatchify
    from ropim.core.sketch import draw_sketch
    from ropim.viz.grids import corruption_columns

    x = validation_images(DataConfig(), 32, 2)
    sk = draw_sketch(2, N, 1 / 7, generator=gen(1))
    cols = corruption_columns(x, P, sk, patchify(x, P))
    torch.testing.assert_close(cols[1] + cols[2], x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cols[4], x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cols[1], unpatchify(sk.project(patchify(x, P)), P), rtol=0, atol=0)


def write_checkpoint(folder: Path, model: ROPIM) -> None:
    """A checkpoint folder in the format of ropim.train: model.safetensors + config.json (PretrainConfig)."""
    from ropim.train.pretrain.config import PretrainConfig

    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(PretrainConfig(model=model.cfg).to_dict()))


@pytest.mark.parametrize("corruption", ["rop", "mask"])
def test_viz_from_checkpoint_writes_pngs_of_expected_size(tmp_path, corruption):
    write_checkpoint(tmp_path / "run" / "checkpoint_000001", make_model(corruption=corruption))
    out = tmp_path / "viz"
    result = run_viz(VizConfig(checkpoint=str(tmp_path / "run"), out=str(out), n_images=3, fig5_images=8))
    with Image.open(out / "reconstruction.png") as png:
        assert png.size == grid_size(3, 5, 32)
    with Image.open(out / "token_errors.png") as png:
        assert png.size == (1000, 400)
    assert json.loads((out / "token_errors.json").read_text())["tokens"] == 8 * N
    assert set(result["paths"]) == {"reconstruction", "token_errors"}


def test_viz_bad_input_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="checkpoint"):
        run_viz(VizConfig(checkpoint=str(tmp_path), out=str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="one of them"):
        run_viz(VizConfig(checkpoint=str(tmp_path), encoder="models:/x/1"))


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A tiny encoder registered in a fresh sqlite MLflow store, in the format ropim.train writes."""
    from ropim.tracking import registry, store
    from ropim.train.pretrain.config import PretrainConfig
    from ropim.train.pretrain.register import encoder_config

    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        model = make_model(corruption="rop")
        cfg = PretrainConfig(model=model.cfg)
        run_id = store.create_run("ropim-pretrain", "tiny", cfg.to_dict(), uri=uri)
        enc_uri = registry.register_encoder(run_id, model.encoder.state_dict(),
                                            encoder_config(cfg, model.encoder.embed_dim), "tiny-encoder", uri)
        store.end_run(run_id, uri=uri)
        yield d, uri, enc_uri, run_id, model
    finally:
        if old is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old


@pytest.mark.slow  # a fresh process (10 s); make test draws from the registered encoder in this one, below
def test_ropim_viz_cli_from_registered_encoder(registered):
    """`ropim viz --encoder URI` in a fresh process: projection grid (no decoder registered) + Figure 5."""
    d, uri, enc_uri, _, _ = registered
    out = d / "viz-cli"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.run(
        [sys.executable, "-m", "ropim.cli", "viz", "--encoder", enc_uri, "--out", str(out), "--n_images", "4",
         "--fig5_images", "16"],
        cwd=d, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "projection.png" in proc.stdout and "Figure 5" in proc.stdout
    with Image.open(out / "projection.png") as png:
        assert png.format == "PNG" and png.size == grid_size(4, 3, 32)
    with Image.open(out / "token_errors.png") as png:
        assert png.size == (1000, 400)
    assert not (out / "reconstruction.png").exists()


def test_viz_from_registered_encoder_with_logged_decoder(registered):
    """When the run also logged decoder/decoder.safetensors, the full grid comes from the registered encoder."""
    from ropim.tracking import store

    d, uri, enc_uri, run_id, model = registered
    f = d / "decoder.safetensors"
    save_file(decoder_state(model), str(f))
    store.client(uri).log_artifact(run_id, str(f), str(Path(DECODER_ARTIFACT).parent))
    _, full, _ = load_registered_model(enc_uri, uri)
    for k, v in model.state_dict().items():
        assert torch.equal(full.state_dict()[k], v), k
    out = d / "viz-decoder"
    run_viz(VizConfig(encoder=enc_uri, out=str(out), n_images=2, fig5_images=4))
    with Image.open(out / "reconstruction.png") as png:
        assert png.size == grid_size(2, 5, 32)


# ---------------------------------------------------------------- figure 5


def test_figure5_rop_touches_more_tokens_than_masking():
    """ROP mixes every token with its bucket mates; masking at 0.75 leaves exactly 25% of tokens exact."""
    x = validation_images(DataConfig(), 32, 8)
    e = token_errors(x, P, rho=0.25, mask_ratio=0.75, threshold=0.1, generator=gen(0))
    s = e.summary()
    assert s["tokens"] == 8 * N and e.rop.shape == e.mask.shape == (8 * N,)
    n_masked = round(0.75 * N)
    assert (e.mask > 0).sum() <= 8 * n_masked  # visible tokens are exact
    assert (e.mask == 0).sum() >= 8 * (N - n_masked)
    assert s["mask_changed"] <= 8 * n_masked
    assert s["rop_changed"] > s["mask_changed"]
    assert s["rop_changed_share"] > 0.9
    # the same holds on noise images (not a property of the digits)
    noise = token_errors(torch.randn(4, 3, 32, 32, generator=gen(2)), P, generator=gen(3)).summary()
    assert noise["rop_changed"] > noise["mask_changed"] == 4 * n_masked


def test_a_fine_tune_checkpoint_is_refused_naming_what_the_grid_needs(tmp_path):
    from ropim.viz.command import load_checkpoint_model

    folder = tmp_path / "finetune-run" / "in_process" / "checkpoint_000001"  # an in-process fine-tune's checkpoint
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"encoder": "models:/ropim-encoder/1", "epochs": 1}))
    with pytest.raises(ConfigError, match=r"finetune-run/in_process/checkpoint_000001'?: not a pretraining "
                                          r"checkpoint .* or give --encoder"):
        load_checkpoint_model(tmp_path / "finetune-run")  # the run folder: its in-process checkpoints are found
