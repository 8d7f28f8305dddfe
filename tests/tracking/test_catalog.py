"""The registry from the terminal: `ropim models list` and `show` on a registry with two versions and an alias, and
the model card every version carries as its MLflow description. Two commands run in a fresh process, as typed (all
that the terminal shows, MLflow's own lines included); the others through ``ropim.cli.main`` in this one."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import mlflow
import pytest
from support import register_tiny_classifier, register_tiny_encoder, run_cli, run_cli_here

from ropim.tracking import registry, store
from ropim.tracking.champion import promote_champion


@pytest.fixture(scope="module")
def two_versions(workdir):
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):  # what MLflow prints while a version is registered
        first, _ = register_tiny_encoder(workdir)
        second, _ = register_tiny_encoder(workdir)
    promote_champion("ropim-encoder", "2", "knn_top1@k=20", "digits", 61.5)
    registry.describe("ropim-encoder", "2")
    store.client().set_model_version_tag("ropim-encoder", "1", "downstream.digits.top1", "93.10")
    registry.describe("ropim-encoder", "1")
    return first, second, printed.getvalue()


def test_registering_prints_no_mlflow_registry_lines(two_versions):
    first, second, printed = two_versions  # ropim prints the URIs itself
    assert (first, second) == ("models:/ropim-encoder/1", "models:/ropim-encoder/2")
    assert "Successfully registered model" not in printed and "Created version" not in printed


def test_models_list_shows_every_version_its_scores_and_aliases(two_versions, workdir):
    proc = run_cli("models", "list", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.strip().splitlines()
    assert header.split()[:3] == ["version", "created", "run"] and len(rows) == 2
    v2, v1 = rows  # newest first
    assert v2.split()[0] == "2" and "knn_top1@k=20 on digits 61.50" in v2 and "champion, champion-digits" in v2
    assert v1.split()[0] == "1" and "fine-tune top-1 on digits 93.10" in v1
    assert "digits" in v1 and "rop" in v1 and "vit" in v1
    assert "no registered versions of 'nope'" in run_cli_here("models", "list", "--name", "nope", cwd=workdir).stdout


def test_models_show_prints_the_card_with_lineage_and_how_to_load(two_versions, workdir):
    proc = run_cli_here("models", "show", "models:/ropim-encoder@champion", cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("aliases: champion, champion-digits") and "# ropim-encoder v2" in out
    assert "- backbone: vit" in out and "- patch_size: 4" in out and "- knn_top1@k=20 on digits: 61.50" in out
    assert f"- pretraining run: {store.client().get_model_version('ropim-encoder', '2').run_id}" in out
    assert 'load_encoder("models:/ropim-encoder/2")' in out
    assert 'mlflow.pyfunc.load_model("models:/ropim-encoder/2")' in out
    bad = run_cli_here("models", "show", "models:/ropim-encoder@nope", cwd=workdir)
    assert bad.returncode != 0 and "no alias 'nope'" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_every_version_carries_its_card_as_description(two_versions):
    c = store.client()
    for version in ("1", "2"):
        description = c.get_model_version("ropim-encoder", version).description
        assert description.startswith(f"# ropim-encoder v{version}") and "## Scores" in description
        assert f'load_encoder("models:/ropim-encoder/{version}")' in description
    assert "fine-tune top-1 on digits: 93.10" in c.get_model_version("ropim-encoder", "1").description


def test_models_show_of_a_model_ropim_did_not_register_is_one_line(two_versions, workdir):
    import mlflow

    with mlflow.start_run() as run:
        mlflow.log_text("not a ropim model", "other/README.txt")
    c = store.client()
    c.create_registered_model("someone-elses-model")
    c.create_model_version("someone-elses-model", f"{run.info.artifact_uri}/other", run_id=run.info.run_id)
    proc = run_cli("models", "show", "models:/someone-elses-model/1", cwd=workdir)  # a fresh process: all it prints
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "models:/someone-elses-model/1: not a ropim model" in proc.stderr


def test_a_classifier_version_carries_the_classifier_card(two_versions, workdir):
    encoder_uri = two_versions[0]
    uri = register_tiny_classifier(encoder_uri, workdir / "enc-local")
    name, version = uri.removeprefix("models:/").split("/")
    c = store.client()
    assert c.get_model_version(name, version).tags["kind"] == "classifier"
    for _ in ("as registered", "registered before the kind tag"):
        description = c.get_model_version(name, version).description
        assert f'classifier, config = load_classifier("{uri}")' in description, description
        assert f'logits = mlflow.pyfunc.load_model("{uri}").predict(images)  # (B, K)' in description
        assert "load_encoder" not in description and "features" not in description
        assert "- top-1 on tiny: 50.00" in description
        c.delete_model_version_tag(name, version, "kind")
        registry.describe(name, version)
    proc = run_cli_here("models", "show", uri, cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert f"- fine-tune run: {c.get_model_version(name, version).run_id}" in proc.stdout
    assert f"- encoder: {encoder_uri}" in proc.stdout and "load_classifier" in proc.stdout


def test_a_version_stores_its_signature_and_no_input_example(two_versions):
    info = mlflow.models.get_model_info("models:/ropim-encoder/1")
    assert info.signature.inputs.inputs[0].shape == (-1, 3, 32, 32)
    assert info.saved_input_example_info is None
    folder = mlflow.artifacts.download_artifacts("models:/ropim-encoder/1")
    assert not [p.name for p in Path(folder).rglob("*example*")]


def test_a_version_pins_the_packages_it_loads_with(two_versions, tmp_path):
    """A team loading the version with MLflow alone (no ropim) months later gets the timm its weights' keys and
    arguments were written for (before: bare names, whatever PyPI held that day)."""
    from importlib import metadata

    folder = mlflow.artifacts.download_artifacts("models:/ropim-encoder/1", dst_path=str(tmp_path))
    wanted = {f"{n}=={metadata.version(n).split('+')[0]}" for n in ("torch", "timm", "safetensors", "numpy")}
    assert wanted <= set((Path(folder) / "requirements.txt").read_text().split())


def test_a_build_pip_cannot_fetch_is_required_from_its_release_on(monkeypatch):
    """A CUDA build's local tag is dropped; an NGC pre-release or a dev build of timm is required as ``>=`` the
    release it leads to: ``==`` of it names nothing PyPI holds."""
    for installed, wanted in (("2.14.1+cu128", "torch==2.14.1"), ("2.6.0a0+git1f2e3d", "torch>=2.6.0"),
                              ("1.0.32.dev0", "torch>=1.0.32")):
        monkeypatch.setattr(store.metadata, "version", lambda name, v=installed: v)
        assert store.requirements("torch") == [wanted]


def test_lineage_lists_the_fine_tunes_of_a_version_not_the_random_init_baselines(two_versions):
    from ropim.tracking.catalog import lineage

    for kind, top1 in (("finetune", 90.0), ("random-init", 70.0)):
        tags = {"ropim.kind": kind, "ropim.encoder_name": "ropim-encoder", "ropim.encoder_version": "1"}
        run = store.create_run("ropim-finetune", f"ft-{kind}", {}, tags)
        store.log_metrics(run, {"top1": top1}, 1)
        store.end_run(run)
    tunes = lineage(store.client().get_model_version("ropim-encoder", "1"))["fine-tunes"]
    assert len(tunes) == 1 and tunes[0].startswith("ft-finetune (") and "top-1 90.00" in tunes[0]


def test_lineage_lists_the_grafts_made_from_a_version(two_versions):
    """A graft run carries the encoder it started from as a fine-tune does (before: left out of the lineage)."""
    from ropim.tracking.catalog import lineage

    tags = {"ropim.kind": "graft", "ropim.encoder_name": "ropim-encoder", "ropim.encoder_version": "2"}
    run = store.create_run("ropim-graft", "lgp-of-2", {}, tags)
    store.log_metrics(run, {"knn_top1": 81.25}, 1)
    store.end_run(run)
    found = lineage(store.client().get_model_version("ropim-encoder", "2"))
    assert found["grafts"] == [f"lgp-of-2 ({run[:8]}, kNN top-1 81.25)"]
    assert lineage(store.client().get_model_version("ropim-encoder", "1"))["grafts"] == []


def test_a_versions_own_last_epoch_scores_are_tagged_with_their_protocol_and_carded():
    """Pretrain's and graft's registered versions carry the kNN / probe scores of their run's last epoch, the
    protocol (k, the bank's sample) beside the value, as MLflow keys take no ``@`` or ``=``; the card lists them."""
    from ropim.data.config import DataConfig
    from ropim.tracking.cards import scores
    from ropim.train.pretrain.config import PretrainConfig

    cfg = PretrainConfig(data=DataConfig(source="digits"), knn_k=10, eval_train_images=40)
    tags = cfg.version_scores({"knn_top1": 57.941, "linear_top1": 61.0, "loss": 0.5})
    assert tags == {"score.digits.knn_top1": "57.94 (k=10,train=40)", "score.digits.linear_top1": "61.00 (train=40)"}
    assert PretrainConfig().version_scores({"loss": 0.5}) == {}  # no evaluation at the last epoch: no score
    assert scores(tags) == {"knn_top1 on digits, its last epoch": "57.94 (k=10,train=40)",
                            "linear_top1 on digits, its last epoch": "61.00 (train=40)"}


def test_a_score_added_while_the_card_is_written_reaches_the_card(two_versions, monkeypatch):
    """Two jobs scoring one version at once: the one writing the card last read the tags before the other's score."""
    real = store.client()

    class Concurrent:  # another job tags the version between this writer's read of the tags and its write
        def __getattr__(self, name):
            return getattr(real, name)

        def update_model_version(self, name, version, description):
            if "downstream.pics.top1" not in (real.get_model_version(name, version).tags or {}):
                real.set_model_version_tag(name, version, "downstream.pics.top1", "71.25")
            return real.update_model_version(name, version, description=description)

    monkeypatch.setattr(registry, "client", lambda uri=None: Concurrent())
    registry.tag_scores("ropim-encoder", "1", {"downstream.digits.knn_top1": 88.0})
    description = real.get_model_version("ropim-encoder", "1").description
    assert "71.25" in description and "88.00" in description, description


def test_reading_a_registered_model_leaves_nothing_in_the_temp_folder(two_versions, tmp_path, monkeypatch):
    """MLflow downloads a version into a fresh temporary folder; each worker of each job that read a registered
    encoder left one there (~350 MB for ViT-B): on a long-lived node the temp folder filled."""
    import tempfile

    from ropim.tracking.catalog import show

    download = mlflow.artifacts.download_artifacts

    def as_from_a_server(*args, dst_path=None, **kwargs):  # a server's artifacts are copied, a local store's are not
        return download(*args, dst_path=dst_path or tempfile.mkdtemp(), **kwargs)

    monkeypatch.setattr(mlflow.artifacts, "download_artifacts", as_from_a_server)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    state, config = registry.load_encoder_files("models:/ropim-encoder/1")
    assert state and config["arch"] and "# ropim-encoder v2" in show("models:/ropim-encoder/2")
    assert list(tmp_path.iterdir()) == []
