"""The champion rule: an alias moves only to a strictly better version scored on the same metric and data set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import register_tiny_encoder, run_cli

from ropim.tracking import store
from ropim.tracking.champion import dataset_alias, promote_champion, settled


def test_champion_rule_per_metric_and_dataset(workdir):
    """The alias rule on bare model versions (no weights needed)."""
    c, name = store.client(), "rule-test"
    c.create_registered_model(name)
    v = [c.create_model_version(name, "file:///nowhere").version for _ in range(5)]

    def promote(version, value, dataset="digits", metric="knn_top1@k=20"):
        return promote_champion(name, version, metric, dataset, value)

    assert promote(v[0], 50.0) == {"champion": (True, "no version held 'champion'"),
                                   "champion-digits": (True, "no version held 'champion-digits'")}
    d = promote(v[1], 40.0)  # worse on the same data: nothing moves
    assert not d["champion"][0] and "does not beat v1's 50" in d["champion"][1]
    assert promote(v[2], 60.0)["champion"][0]  # better: both aliases move
    other = promote(v[3], 99.0, dataset="/data/cifar10")  # another data set keeps its own champion only
    assert other["champion"] == (False, "'champion' is v3 on another dataset (digits)")
    assert other[dataset_alias("/data/cifar10")][0] and dataset_alias("/data/cifar10").startswith(
        "champion-cifar10-")
    assert not promote(v[4], 99.0, metric="knn_top1@k=10")["champion"][0]  # not comparable: another metric
    aliases = {a: c.get_model_version_by_alias(name, a).version for a in ("champion", "champion-digits")}
    assert aliases == {"champion": v[2], "champion-digits": v[2]}
    tags = c.get_model_version(name, v[1]).tags
    assert tags["metric_value"] == "40.0" and tags["metric_dataset"] == "digits"
    assert tags["alias.champion"].startswith("not moved: knn_top1@k=20 40 does not beat")


def test_a_store_error_reading_the_holder_moves_no_alias(workdir, monkeypatch):
    """A server that fails the holder's look-up (after MLflow's retries) stops the promotion; before, any error read
    as "no version held it" and the alias moved without a comparison."""
    import mlflow
    from mlflow.tracking import MlflowClient

    c, name = store.client(), "outage-test"
    c.create_registered_model(name)
    v = [c.create_model_version(name, "file:///nowhere").version for _ in range(2)]
    promote_champion(name, v[0], "knn_top1@k=20", "digits", 50.0)

    def unavailable(self, model, alias):
        raise mlflow.exceptions.MlflowException("503 Service Unavailable", error_code="TEMPORARILY_UNAVAILABLE")

    with monkeypatch.context() as m:
        m.setattr(MlflowClient, "get_model_version_by_alias", unavailable)
        with pytest.raises(mlflow.exceptions.MlflowException, match="503"):
            promote_champion(name, v[1], "knn_top1@k=20", "digits", 10.0)
    assert c.get_model_version_by_alias(name, "champion").version == v[0]


def test_a_downstream_champion_registered_before_recipes_were_recorded_gives_way(workdir):
    """A version promoted by a `finetune_top1` sweep before the tag named its recipe: the first score under a
    recorded recipe takes the alias (the two are not comparable, and the old tag never would be again)."""
    c, name = store.client(), "recipe-test"
    c.create_registered_model(name)
    v = [c.create_model_version(name, "file:///nowhere").version for _ in range(3)]
    promote_champion(name, v[0], "finetune_top1", "digits", 90.0)
    moved = promote_champion(name, v[1], "finetune_top1@recipe=aaaa", "digits", 50.0)["champion"]
    assert moved == (True, "'champion' was v1, scored by finetune_top1 under a recipe not recorded")
    other = promote_champion(name, v[2], "finetune_top1@recipe=bbbb", "digits", 99.0)["champion"]
    assert not other[0] and "another metric (finetune_top1@recipe=aaaa)" in other[1]  # another recipe: kept
    assert c.get_model_version_by_alias(name, "champion").version == v[1]


TINY, SMALL = "vit_tiny_patch16_224", "vit_small_patch16_224"


def test_a_per_shape_alias_only_ever_holds_an_encoder_of_its_shape(workdir):
    """The per-shape alias is the best encoder of its shape: a better-scoring encoder of another shape (patch 8 vs 4,
    ViT-S vs ViT-T) on the same metric and data never takes it, not even when settling; the overall and per-dataset
    champions follow the score alone. Every decision returned (what the sweep prints) says where the alias is."""
    c, name = store.client(), "shape-test"
    c.create_registered_model(name)
    v = [str(c.create_model_version(name, "file:///nowhere").version) for _ in range(5)]

    def promote(version, value, model):
        d = promote_champion(name, version, "knn_top1@k=20", "digits", value, model=model)
        for alias, (moved, _) in d.items():  # `moved` is true exactly when the version holds the alias now
            assert (str(c.get_model_version_by_alias(name, alias).version) == version) == moved, (alias, d)
        return d

    promote(v[0], 57.94, (TINY, 8, 32))
    d = promote(v[1], 49.86, (TINY, 4, 32))  # worse than v1, of another shape: takes only its shape's alias
    assert d["champion-vit_t4-32"] == (True, "no version held 'champion-vit_t4-32'")
    assert not d["champion"][0] and not d["champion-digits"][0]
    assert c.get_model_version(name, v[1]).tags["shape"] == "vit_t4-32"
    assert promote(v[2], 90.0, (SMALL, 4, 32))["champion"][0]  # ViT-S: the model-wide champion, not ViT-T's alias
    d = promote(v[3], 45.0, (TINY, 4, 32))
    assert d["champion-vit_t4-32"] == (False, "knn_top1@k=20 45 does not beat v2's 49.86 on digits")
    holders = {a: str(c.get_model_version_by_alias(name, a).version) for a in (
        "champion", "champion-digits", "champion-vit_t8-32", "champion-vit_t4-32", "champion-vit_s4-32")}
    assert holders == {"champion": v[2], "champion-digits": v[2], "champion-vit_t8-32": v[0],
                       "champion-vit_t4-32": v[1], "champion-vit_s4-32": v[2]}
    c.set_registered_model_alias(name, "champion-vit_t4-32", v[0])  # as an older ropim left it: patch 8 holds it
    d = promote(v[4], 40.0, (TINY, 4, 32))  # the right shape takes it back; settling hands it to the best of them
    assert d["champion-vit_t4-32"] == (False, "'champion-vit_t4-32' was v1, an encoder of another shape (vit_t8-32), "
                                              "but it settled on v2 once every version's score was re-read")
    assert str(c.get_model_version_by_alias(name, "champion-vit_t4-32").version) == v[1]


def test_a_decision_settled_elsewhere_says_so(workdir):
    """When settling moves an alias away from the promoted version (or onto it), the decision and its tag say so."""
    c, name = store.client(), "settled-test"
    c.create_registered_model(name)
    v = [str(c.create_model_version(name, "file:///nowhere").version) for _ in range(2)]
    c.set_registered_model_alias(name, "champion", v[1])
    d = settled(c, name, v[0], {"champion": (True, "no version held 'champion'")})
    assert d == {"champion": (False, "no version held 'champion', but it settled on v2 once every version's score "
                                     "was re-read")}
    assert c.get_model_version(name, v[0]).tags["alias.champion"].startswith("not moved: no version held")
    assert settled(c, name, v[1], {"champion": (False, "x")})["champion"][0]


RACER = """
import random, sys, time
from ropim.tracking.champion import promote_champion
version, value, uri = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rng = random.Random(version)
print("ready", flush=True)  # MLflow imported
for name in sys.argv[4:]:
    sys.stdin.readline()  # the test starts both sides of a round together
    time.sleep(rng.random() * 0.05)
    promote_champion(name, version, "knn_top1@k=20", "digits", value, uri=uri)
    print("done", flush=True)
"""


def test_two_concurrent_promotions_leave_the_better_encoder_holding_both_aliases(workdir):
    """Two processes promote two versions of the same model at the same moment, many times: every time the better
    version ends up holding `champion` and `champion-digits` (MLflow has no compare-and-set)."""
    c, uri = store.client(), os.environ["MLFLOW_TRACKING_URI"]
    names = [f"race-{i}" for i in range(12)]
    for name in names:
        c.create_registered_model(name)
        for _ in range(2):
            c.create_model_version(name, "file:///nowhere")
    sides = [subprocess.Popen([sys.executable, "-c", RACER, version, value, uri, *names], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for version, value in (("1", "70"), ("2", "40"))]
    for _ in names:  # a round starts when both sides are ready: MLflow imported, the round before finished
        for p in sides:
            assert p.stdout.readline().strip() in ("ready", "done"), p.stderr.read()[-2000:]
        for p in sides:
            p.stdin.write("go\n")
            p.stdin.flush()
    for p in sides:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
    for name in names:
        holders = {a: str(c.get_model_version_by_alias(name, a).version) for a in ("champion", "champion-digits")}
        assert holders == {"champion": "1", "champion-digits": "1"}, (name, holders)


@pytest.mark.slow  # a fresh `ropim finetune` process: make test-slow, to keep make test under 6 minutes
def test_a_digits_champion_is_never_the_paper_presets_encoder(workdir):
    """A sweep on digits promotes its encoder to `champion`; the paper presets load the champion of their own shape
    (ViT-B/16 at 224), so `ropim finetune --preset vit_base` without --encoder is refused in pre-flight, in one line,
    instead of fine-tuning a 32-px digits encoder on ImageNet."""
    uri, _ = register_tiny_encoder(workdir)
    name, version = uri.removeprefix("models:/").split("/")
    d = promote_champion(name, version, "knn_top1@k=20", "digits", 61.5, model=("vit_tiny_patch16_224", 4, 32))
    assert d["champion-vit_t4-32"] == (True, "no version held 'champion-vit_t4-32'")
    assert str(store.client().get_model_version_by_alias(name, "champion").version) == version
    proc = run_cli("finetune", "--preset", "vit_base", "--data.source", "digits", cwd=workdir)
    assert proc.returncode != 0 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "models:/ropim-encoder@champion-vit_b16-224: no alias 'champion-vit_b16-224'" in proc.stderr
    assert "give --encoder models:/ropim-encoder/VERSION" in proc.stderr
    cpu = ("--use_gpu", "false", "--num_workers", "0", "--global_batch_size", "64", "--accum_steps", "1")
    digits = ("--data.format", "digits", "--crop_size", "64", "--eval_stride", "42")  # the preset's 341 fits 512
    for job, preset, flags in (("graft", "vit_base_in1k", cpu), ("segment", "ade20k_upernet_vit_base", digits)):
        refused = run_cli(job, "--preset", preset, "--data.source", "digits", *flags, cwd=workdir)
        assert refused.returncode != 0 and "no alias 'champion-vit_b16-224'" in refused.stderr, refused.stderr
