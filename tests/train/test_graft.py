"""LGP-ROPIM's graft (MoCo v3 on a registered encoder) in this process: the per-layer learning rates as the optimizer
holds them, a graft interrupted and continued ending exactly where an uninterrupted one does (momentum schedule and
momentum branch included), and the grafted encoder registered with its lineage and loadable like any encoder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support import encoder_folder

from ropim.cli import PRESETS, job_parser, shipped_presets
from ropim.commands import config
from ropim.core.config import ModelConfig
from ropim.core.contrastive import momentum_at
from ropim.data.config import DataConfig
from ropim.tracking import catalog, registry, store
from ropim.train.driver import run
from ropim.train.graft.config import GraftConfig
from ropim.train.graft.task import GraftTask
from ropim.train.inprocess import LocalWorker
from ropim.train.loop import Loop
from ropim.train.pretrain.config import PretrainConfig

MODEL = ModelConfig(img_size=32, patch_size=8, depth=3)  # 16 tokens, 3 blocks: a split with blocks on either side


def tiny_graft(encoder: str, **changes) -> GraftConfig:
    """Two epochs of two steps of 8 images, small MLPs, no warm-up, in this process."""
    return GraftConfig(**{"encoder": encoder, "epochs": 2, "global_batch_size": 8, "max_steps_per_epoch": 2,
                          "num_workers": 0, "mlp_dim": 32, "proj_dim": 16, "warmup_epochs": 0, "log_every": 100,
                          **changes})


@pytest.fixture(scope="module")
def first_stage(workdir) -> tuple[str, str, Path]:
    """A registered first-stage encoder: (its URI, its run id, the same weights as a folder)."""
    folder = encoder_folder(workdir / "first-stage", MODEL)
    run_id = store.create_run("ropim-pretrain", "first-stage", PretrainConfig(model=MODEL).to_dict())
    uri = registry.register_encoder(run_id, load_file(str(folder / "encoder.safetensors")),
                                    json.loads((folder / "config.json").read_text()))
    store.end_run(run_id)
    return uri, run_id, folder


def test_lower_blocks_learn_at_the_ratio_as_the_optimizer_holds_it(first_stage, tmp_path):
    cfg = tiny_graft(first_stage[0], lower_blocks=2, lower_lr_ratio=0.1)
    task = GraftTask({"cfg": cfg.to_dict(), "run_id": "", "tracking_uri": store.tracking_uri(),
                      "run_dir": str(tmp_path)}, LocalWorker(tmp_path, 1))
    loop = Loop(task, cfg, task.worker)
    names = {id(p): n for n, p in loop.model.named_parameters()}

    def lrs() -> dict[str, float]:
        return {names[id(p)]: g["lr"] for g in loop.optimizer.param_groups for p in g["params"]}

    for step in (0, 2):  # the start (no warm-up: the peak) and the cosine's middle
        loop.scheduler.step_update(step)
        lr = lrs()
        upper = lr["encoder.blocks.2.attn.qkv.weight"]
        assert upper == pytest.approx(cfg.lr if step == 0 else cfg.lr / 2)
        assert lr["projector.0.weight"] == lr["predictor.0.weight"] == lr["encoder.norm.weight"] == upper
        for lower in ("encoder.blocks.0.attn.qkv.weight", "encoder.blocks.1.mlp.fc2.bias", "encoder.cls_token",
                      "encoder.pos_embed"):
            assert lr[lower] == pytest.approx(0.1 * upper)
    assert "encoder.patch_embed.proj.weight" not in lrs()  # frozen (MoCo v3's fix): not in the optimizer
    assert not any(n.startswith("momentum_") for n in lrs())  # moved by EMA, not by gradients


def moco_v3_lr(peak: float, epoch: float, warmup: float, epochs: int) -> float:
    """MoCo v3's ``adjust_learning_rate`` (main_moco.py; LGP's main_pretrain.py alike) at a fractional epoch: linear
    from 0 over the warm-up, then a half cosine to 0 over the remaining epochs."""
    if epoch < warmup:
        return peak * epoch / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (epoch - warmup) / (epochs - warmup)))


def test_the_learning_rate_follows_moco_v3s_schedule_per_step(first_stage, tmp_path):
    cfg = tiny_graft(first_stage[0], epochs=4, max_steps_per_epoch=4, warmup_epochs=1.5, lower_blocks=2)
    task = GraftTask({"cfg": cfg.to_dict(), "run_id": "", "tracking_uri": store.tracking_uri(),
                      "run_dir": str(tmp_path)}, LocalWorker(tmp_path, 1))
    loop = Loop(task, cfg, task.worker)
    assert loop.steps == 4 and loop.total_steps == 16
    for step in (0, 3, 6, 7, 10, 15):  # warm-up, its last step, the peak, the cosine after it, the last step
        loop.scheduler.step_update(step)  # the rate optimizer step ``step`` (0-based) trains at: epoch step / 4
        want = moco_v3_lr(cfg.lr, step / loop.steps, cfg.warmup_epochs, cfg.epochs)
        lrs = {g["name"]: g["lr"] for g in loop.optimizer.param_groups}
        assert lrs["upper_decay"] == pytest.approx(want, rel=1e-9, abs=1e-15), step
        assert lrs["lower_decay"] == pytest.approx(cfg.lower_lr_ratio * want, rel=1e-9, abs=1e-15), step
    pretrain = PretrainConfig(warmup_epochs=10, epochs=300)
    assert not pretrain.warmup_prefix  # pretraining keeps timm's cosine over all steps, as the paper's code builds it


def test_momentum_moves_once_per_optimizer_step_under_accumulation(first_stage, tmp_path, monkeypatch):
    cfg = tiny_graft(first_stage[0], accum_steps=2, max_steps_per_epoch=2)  # 2 steps of 2 micro batches of 4
    task = GraftTask({"cfg": cfg.to_dict(), "run_id": "", "tracking_uri": store.tracking_uri(),
                      "run_dir": str(tmp_path)}, LocalWorker(tmp_path, 1))
    loop = Loop(task, cfg, task.worker)
    moves = []
    monkeypatch.setattr(task.model, "update_momentum", moves.append)
    tally = loop.train_epoch(0)
    assert tally.steps == 2 and tally.images == 16
    assert moves == [momentum_at(0, 4, 0.99), momentum_at(1, 4, 0.99)]  # K = 2 epochs x 2 steps


def test_interrupted_graft_resumes_the_momentum_schedule_exactly(first_stage, workdir):
    enc = str(first_stage[2])
    short = dict(max_steps_per_epoch=1, registered_model="")  # 2 epochs of 1 step
    whole = run(tiny_graft(enc, run_name="whole", **short))
    cut = run(tiny_graft(enc, run_name="cut", stop_after_epochs=1, **short))
    assert cut.model_uri is None and cut.metrics["epoch"] == 1
    resumed = run(tiny_graft(enc, run_name="cut", **short))
    assert resumed.metrics["step"] == whole.metrics["step"] == 2
    a = load_file(str(Path(whole.checkpoint_path) / "model.safetensors"))
    b = load_file(str(Path(resumed.checkpoint_path) / "model.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("momentum_encoder.") for k in a)
    for k in a:  # bit for bit: the same data order, views, steps, momenta
        assert (a[k] == b[k]).all(), k
    c = store.client()
    history = [[m.value for m in sorted(c.get_metric_history(r.run_id, "momentum"), key=lambda m: m.step)]
               for r in (whole, resumed)]
    assert history[0] == history[1] == [momentum_at(0, 2, 0.99), momentum_at(1, 2, 0.99)]  # 0.99, 0.995


def test_grafted_encoder_is_registered_with_its_lineage(first_stage, workdir):
    uri, first_run, folder = first_stage
    result = run(tiny_graft(uri, run_name="lgp", eval_every=2))
    name, version = result.model_uri.removeprefix("models:/").split("/")
    mv = store.client().get_model_version(name, version)
    assert mv.tags["stage"] == "lgp" and mv.tags["source_encoder"] == uri and mv.tags["source_run"] == first_run
    assert f"- first stage: {uri} (run {first_run})" in mv.description
    shown = catalog.show(result.model_uri)
    assert f"- lgp run: {result.run_id}" in shown and f"- first stage: {uri} (run {first_run})" in shown
    assert "lgp" in catalog.list_versions(name)
    score = f"{result.metrics['knn_top1']:.2f} (k=20)"  # its own final kNN score, tagged, on its card (before: none)
    assert mv.tags["score.digits.knn_top1"] == score
    assert f"- knn_top1 on digits, its last epoch: {score}" in shown
    assert f"- grafts: lgp ({result.run_id[:8]}, kNN top-1 " in catalog.show(uri)  # the first stage's card
    encoder, config = registry.load_encoder(result.model_uri)  # loadable like any encoder: a plain timm model
    before = load_file(str(folder / "encoder.safetensors"))
    after = encoder.state_dict()
    assert type(encoder).__name__ == "VisionTransformer" and config["lower_blocks"] == 2
    assert (after["patch_embed.proj.weight"] == before["patch_embed.proj.weight"]).all()  # frozen
    assert not (after["blocks.2.attn.qkv.weight"] == before["blocks.2.attn.qkv.weight"]).all()  # trained
    again = run(tiny_graft(uri, run_name="lgp", eval_every=2))  # a finished graft is reported, not registered again
    assert again.model_uri == result.model_uri
    assert len(store.client().search_model_versions(f"name='{name}'")) == int(version)


def load_preset(name: str, *overrides: str) -> GraftConfig:
    parser = job_parser(GraftConfig, "graft", "test")
    return config(parser.instantiate(parser.parse_args(["--preset", name, *overrides])), GraftConfig)


def test_graft_presets_validate_and_the_paper_one_is_lgps_vit_b_command():
    for name in shipped_presets(PRESETS / "graft"):
        load_preset(name, "--data.source", "digits").validate()
    paper = load_preset("vit_base_in1k")
    assert (paper.epochs, paper.global_batch_size, paper.warmup_epochs, paper.weight_decay) == (300, 4096, 40, 0.1)
    assert paper.lr == pytest.approx(2.4e-3)  # LGP: --lr 1 x 4096 / 256 x lr_scale 1.5e-4 for the top third
    assert (paper.lower_blocks, paper.lower_lr_ratio) == (8, 0.1)  # 1.5e-5 for the embedding and blocks 1-8
    assert (paper.temperature, paper.momentum, paper.momentum_cosine) == (0.2, 0.99, True)
    assert (paper.mlp_dim, paper.proj_dim, paper.freeze_patch_embed, paper.crop_min) == (4096, 256, True, 0.08)
    assert paper.global_batch_size // (paper.num_workers * paper.accum_steps) == 64  # LGP's 64 images per GPU
    assert paper.num_workers <= 8  # the GPU workers ray_cluster.yaml can start: 8 x 8 accumulation steps


def test_local_paths_resolve_against_the_callers_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = GraftConfig(encoder="enc", storage_path="runs", data=DataConfig(source="imgs")).resolved()
    assert (cfg.encoder, cfg.storage_path, cfg.data.source) == (str(tmp_path / "enc"), str(tmp_path / "runs"),
                                                                str(tmp_path / "imgs"))
    remote = GraftConfig(encoder="models:/ropim-encoder@champion", storage_path="s3://bucket/runs").resolved()
    assert (remote.encoder, remote.storage_path, remote.data.source) == ("models:/ropim-encoder@champion",
                                                                         "s3://bucket/runs", "digits")


def test_a_grafts_evaluation_scores_on_its_sample_of_the_train_split(first_stage, workdir, monkeypatch):
    from ropim.train.graft import task as module

    banks, real = [], module.frozen_scores

    def spied(*args, **kwargs):
        banks.append(kwargs.get("train_images"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "frozen_scores", spied)
    result = run(tiny_graft(first_stage[0], run_name="lgp-sampled", eval_every=2, eval_train_images=40,
                            registered_model=""))
    assert banks == [40] and 0 < result.metrics["knn_top1"] <= 100  # the final epoch's evaluation, on 40 images
