"""Registered models served over HTTP: a tiny ``ropim-encoder``, a ``ropim-classifier`` and a ``ropim-segmenter`` built
on it, each served by ``mlflow models serve -m models:/NAME/VERSION --env-manager local`` on a loopback port, answer
a real ``POST /invocations`` with what the in-process pyfunc gives (features, logits, per-pixel logits), in the
shapes and dtype their registered signatures name; an image of the wrong size is a 400 that names the expected shape.
The servers load the models without pickle and see this checkout's ropim (none of the three models imports it)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import mlflow
import numpy as np
import pytest
from safetensors.torch import load_file
from support import TINY_MODEL, register_tiny_encoder

import ropim
from ropim.core.backbone import build_classifier
from ropim.core.segmenter import segmenter_from_encoder
from ropim.tracking import registry, store
from ropim.tracking.segmenters import register_segmenter

pytestmark = pytest.mark.cluster

KINDS = ("encoder", "classifier", "segmenter")
SIZE = TINY_MODEL.img_size
CLASSES, SEG_CLASSES = ["cat", "dog", "fox"], ["sky", "tree", "road", "car"]
INPUT = (-1, 3, SIZE, SIZE)  # every kind's signature input: normalized float32 images
OUTPUT = {"encoder": (-1, 192), "classifier": (-1, len(CLASSES)), "segmenter": (-1, len(SEG_CLASSES), SIZE, SIZE)}
ATOL = 1e-5  # the in-process pyfunc test's (tests/train/test_finetune.py)
START_TIMEOUT = 240  # seconds for the three servers to answer /health


@pytest.fixture(scope="module")
def registered(workdir: Path) -> dict[str, str]:
    """kind -> ``models:/`` URI: a tiny encoder (``ropim-encoder`` v1) and, built on its weights, a 3-class classifier
    and a 4-class segmenter (an 8-channel UperNet), registered as fine-tune and segmentation jobs register them."""
    encoder_uri, folder = register_tiny_encoder(workdir)
    state, config = load_file(str(folder / "encoder.safetensors")), json.loads((folder / "config.json").read_text())
    lineage = {"img_size": SIZE, "dataset": "tiny", "encoder_uri": encoder_uri}
    clf = build_classifier(config["arch"], config["timm_kwargs"], state, len(CLASSES))
    run_id = store.create_run("ropim-finetune", "serve", {})
    classifier_uri = registry.register_classifier(
        run_id, clf.model.state_dict(), {"arch": clf.name, "timm_kwargs": clf.kwargs, "num_classes": len(CLASSES),
                                         "classes": CLASSES, "patch_size": TINY_MODEL.patch_size, **lineage})
    store.end_run(run_id)
    seg = segmenter_from_encoder(config["arch"], config["timm_kwargs"], state, len(SEG_CLASSES), SIZE, channels=8,
                                 aux_channels=8)
    run_id = store.create_run("ropim-segment", "serve", {})
    segmenter_uri = register_segmenter(run_id, seg.model.state_dict(),
                                       {**seg.config, "classes": SEG_CLASSES, **lineage})
    store.end_run(run_id)
    return {"encoder": encoder_uri, "classifier": classifier_uri, "segmenter": segmenter_uri}


@pytest.fixture(scope="module")
def served(registered: dict[str, str], serve_models, workdir: Path) -> Iterator[dict[str, str]]:
    """kind -> URL of its model under ``mlflow models serve`` (all three started at once, pickle refused, this
    checkout's ropim first on PYTHONPATH); stopped at the end, whatever the tests did."""
    checkout = str(Path(ropim.__file__).resolve().parents[1])
    env = {**os.environ, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [checkout, os.environ.get("PYTHONPATH")]))}
    with serve_models([registered[k] for k in KINDS], workdir, env, START_TIMEOUT) as urls:
        yield dict(zip(KINDS, urls, strict=True))


def invoke(url: str, body: dict) -> dict:
    """The JSON answer of ``POST url/invocations`` with ``body`` (an HTTPError for a status other than 2xx)."""
    request = urllib.request.Request(f"{url}/invocations", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


@pytest.mark.parametrize("kind", KINDS)
def test_served_model_answers_as_the_in_process_pyfunc(kind: str, registered: dict[str, str],
                                                       served: dict[str, str]) -> None:
    uri = registered[kind]
    signature = mlflow.models.get_model_info(uri).signature
    (inp,), (out,) = signature.inputs.inputs, signature.outputs.inputs
    assert (inp.type, inp.shape, out.type, out.shape) == (np.float32, INPUT, np.float32, OUTPUT[kind])
    x = np.random.default_rng(0).standard_normal((2, *inp.shape[1:])).astype(inp.type)
    got = np.asarray(invoke(served[kind], {"inputs": x.tolist()})["predictions"], dtype=out.type)
    expected = mlflow.pyfunc.load_model(uri).predict(x)
    assert expected.dtype == out.type and got.shape == expected.shape == (2, *out.shape[1:])
    assert np.abs(expected).max() > 100 * ATOL  # values the tolerance tells apart
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def test_an_image_of_the_wrong_size_is_a_400_naming_the_expected_shape(served: dict[str, str]) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        invoke(served["classifier"], {"inputs": np.zeros((1, 3, SIZE // 2, SIZE // 2)).tolist()})
    answer = json.loads(err.value.read())
    assert err.value.code == 400 and answer["error_code"] == "INVALID_PARAMETER_VALUE"
    assert f"expected shape {INPUT}" in answer["message"]
