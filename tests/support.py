"""What several test modules share: tiny configs, model and encoder builders, a runner for the ``ropim`` command in a
fresh process. (The shared fixtures are in ``conftest.py``.)"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from ropim.core.config import ModelConfig
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.pretrain.config import PretrainConfig

ROOT = Path(__file__).resolve().parents[1]
TINY_MODEL = ModelConfig(img_size=32, patch_size=4, depth=1)  # 64 tokens, one block: seconds per epoch on a CPU
# a pretraining run of a few seconds: 3 steps of 16 images per epoch, pictures off
TINY_PRETRAIN = PretrainConfig(model=TINY_MODEL, epochs=2, global_batch_size=16, max_steps_per_epoch=3,
                               warmup_epochs=1, viz_every=0, log_every=100)
# a fine-tune of a few seconds: 2 steps of 16 images per epoch
TINY_FINETUNE = dict(epochs=2, batch_size=16, max_steps_per_epoch=2, warmup_epochs=0, log_every=1)


@contextlib.contextmanager
def gloo_rank(rank: int, init: str, out, blanks: int = 1) -> Iterator[None]:
    """This process as rank ``rank`` of a 2-process gloo group (``init``: its rendezvous) for the block; what the
    block raises is put on ``out`` as ``(rank, traceback, None × blanks)``, for ``on_two_ranks`` to return rather than
    wait for, then raised."""
    import traceback

    import torch

    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        yield
    except BaseException:
        out.put((rank, traceback.format_exc(), *[None] * blanks))
        raise
    finally:
        torch.distributed.destroy_process_group()


def on_two_ranks(target: Callable, tmp_path: Path, *args, timeout: float = 120) -> dict[int, tuple]:
    """``target(rank, init, *args, out)`` in two fresh processes of one gloo group (spawned: a fork of a process that
    ran torch ops can hang), ``init`` their rendezvous file in ``tmp_path``; each puts ``(rank, *values)`` on ``out``.
    {rank: values}; the test fails when a worker does not report within ``timeout`` s (one waits for the other)."""
    import queue

    import pytest
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [ctx.Process(target=target, args=(rank, init, *args, out)) for rank in range(2)]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in procs:
            rank, *values = out.get(timeout=timeout)
            got[rank] = tuple(values)
    except queue.Empty:
        pytest.fail("the workers did not finish: one waits for the other")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got


def pretrain_preset(name: str, *overrides: str) -> PretrainConfig:
    """The PretrainConfig of ``ropim pretrain --preset NAME OVERRIDES…``, as the command line builds it."""
    from ropim.cli import job_parser
    from ropim.commands import config

    parser = job_parser(PretrainConfig, "pretrain", "test")
    return config(parser.instantiate(parser.parse_args(["--preset", name, *overrides])), PretrainConfig)


def tiny_pretrain(**changes) -> PretrainConfig:
    """``TINY_PRETRAIN`` with ``changes`` (``model`` may be a dict of ModelConfig changes)."""
    model = changes.pop("model", {})
    if isinstance(model, dict):
        model = dataclasses.replace(TINY_MODEL, **model)
    return dataclasses.replace(TINY_PRETRAIN, model=model, **changes)


def tiny_finetune(encoder: str, **changes) -> FinetuneConfig:
    return FinetuneConfig(encoder=encoder, **{**TINY_FINETUNE, **changes})


def encoder_folder(path: Path, model: ModelConfig = TINY_MODEL, seed: int = 0) -> Path:
    """A local encoder folder (encoder.safetensors + config.json), as registered encoders hold."""
    import torch
    from safetensors.torch import save_file

    from ropim.core.model import create_encoder
    from ropim.train.pretrain.register import encoder_config

    torch.manual_seed(seed)
    enc = create_encoder(model)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in enc.state_dict().items()}, str(path / "encoder.safetensors"))
    (path / "config.json").write_text(json.dumps(encoder_config(PretrainConfig(model=model), enc.embed_dim)))
    return path


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """``ropim ARGS`` in a fresh Python process."""
    return subprocess.run([sys.executable, "-m", "ropim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def run_cli_here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``ropim ARGS`` through ``ropim.cli.main`` in this process, from ``cwd``: its exit status and output as the
    terminal would show them (a ``SystemExit`` message is the one stderr line Python prints), without an interpreter
    start and MLflow's import per call (``run_cli`` pays those: keep one such run where the fresh process matters)."""
    from ropim.cli import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exit_:
            code = 0 if exit_.code is None else exit_.code if isinstance(exit_.code, int) else 1
            if isinstance(exit_.code, str):
                print(exit_.code, file=sys.stderr)
    return subprocess.CompletedProcess(["ropim", *args], code, out.getvalue(), err.getvalue())


# ``run_cli_in_one_process``'s program: each command line through ``ropim.cli.main``, then which heavy modules it
# imported on the way
IN_ONE_PROCESS = """
import json, sys
from ropim.cli import main
argvs, heavy = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for argv in argvs:
    try:
        main(argv)
    except SystemExit as err:
        print("EXIT", err)
print("HEAVY", sorted(m for m in heavy if m in sys.modules))
"""


def run_cli_in_one_process(argvs: list[list[str]], heavy: tuple[str, ...], cwd: Path, env: dict | None = None,
                           timeout: float = 300) -> subprocess.CompletedProcess:
    """Each of ``argvs`` through ``ropim.cli.main`` in one fresh process, each exit printed as ``EXIT <message>``, then
    ``HEAVY [...]``: which of ``heavy`` (e.g. torch, ray) those commands imported."""
    return subprocess.run([sys.executable, "-c", IN_ONE_PROCESS, json.dumps(argvs), json.dumps(list(heavy))],
                          capture_output=True, text=True, cwd=cwd, env={**os.environ, **(env or {})},
                          timeout=timeout)

# The body of ``run_cli_forked``'s parent: imports ``ropim.cli`` once (what ``python -m ropim.cli`` imports before it
# parses), then runs each case as ``python -m ropim.cli ARGV`` in a child forked from it, a few at a time.
FORKING = r"""
import json, os, runpy, sys
import ropim.cli
del sys.modules["ropim.cli"]  # what it imports stays; runpy runs the module itself as __main__

cases, cwd, out, parallel = json.loads(sys.stdin.read())
running, status = {}, {}
for i, (argv, env) in enumerate(cases):
    if len(running) == parallel:
        pid, st = os.wait()
        status[running.pop(pid)] = os.waitstatus_to_exitcode(st)
    pid = os.fork()
    if pid == 0:  # the child: a user's `ropim ARGV` in `cwd`, its output to two files
        os.chdir(cwd)
        os.environ.update(env)
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(f"{out}/{i}.{name}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["ropim", *argv]
        runpy.run_module("ropim.cli", run_name="__main__", alter_sys=True)
        sys.exit(0)
    running[pid] = i
while running:
    pid, st = os.wait()
    status[running.pop(pid)] = os.waitstatus_to_exitcode(st)
print(json.dumps(status))
"""


def run_cli_forked(cases: list[tuple[list[str], dict]], cwd: Path, parallel: int = 4,
                   timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """``ropim ARGV`` for each (argv, extra env) of ``cases``, each in its own process, forked from one that has
    imported ``ropim.cli`` (what a user sees, without an interpreter start per case; ``run_cli`` starts one)."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as out:  # outside ``cwd``: the cases' folders stay as the cases left them
        proc = subprocess.run([sys.executable, "-c", FORKING], input=json.dumps([cases, str(cwd), out, parallel]),
                              capture_output=True, text=True, env=os.environ.copy(), timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        status = json.loads(proc.stdout.splitlines()[-1])
        return [subprocess.CompletedProcess(["ropim", *argv], status[str(i)], Path(f"{out}/{i}.out").read_text(),
                                            Path(f"{out}/{i}.err").read_text()) for i, (argv, _) in enumerate(cases)]


def register_tiny_encoder(workdir: Path) -> tuple[str, Path]:
    """A tiny encoder registered as ``ropim-encoder`` (alias 'champion' on version 1); also kept as a local folder."""
    from safetensors.torch import load_file

    from ropim.tracking import registry, store

    folder = encoder_folder(workdir / "enc-local")
    state, config = load_file(str(folder / "encoder.safetensors")), json.loads((folder / "config.json").read_text())
    run_id = store.create_run("ropim-pretrain", "tiny", PretrainConfig(model=TINY_MODEL).to_dict())
    uri = registry.register_encoder(run_id, state, config)
    store.end_run(run_id)
    store.client().set_registered_model_alias("ropim-encoder", "champion", uri.rsplit("/", 1)[1])
    return uri, folder


def register_tiny_classifier(encoder_uri: str, folder: Path, classes: tuple[str, ...] = ("cat", "dog", "fox")) -> str:
    """A classifier built on the tiny encoder in ``folder`` (registered as ``encoder_uri``), registered as
    ``ropim-classifier`` with the config fine-tuning stores; its ``models:/`` URI."""
    from safetensors.torch import load_file

    from ropim.core.backbone import build_classifier
    from ropim.tracking import registry, store

    state, config = load_file(str(folder / "encoder.safetensors")), json.loads((folder / "config.json").read_text())
    clf = build_classifier(config["arch"], config["timm_kwargs"], state, len(classes))
    run_id = store.create_run("ropim-finetune", "tiny", {})
    uri = registry.register_classifier(run_id, clf.model.state_dict(), {
        "arch": clf.name, "timm_kwargs": clf.kwargs, "num_classes": len(classes), "classes": list(classes),
        "img_size": TINY_MODEL.img_size, "patch_size": TINY_MODEL.patch_size, "dataset": "tiny",
        "encoder_uri": encoder_uri, "top1": 50.0, "top5": 100.0})
    store.end_run(run_id)
    return uri


def gen(seed: int = 0):
    """A CPU torch generator seeded with ``seed``."""
    import torch

    return torch.Generator().manual_seed(seed)


def make_model(base: ModelConfig, **changes):
    """A ROPIM model of ``base`` with ``changes``, same initial weights every time, in eval mode."""
    import torch

    from ropim.core.model import ROPIM

    torch.manual_seed(0)
    return ROPIM(dataclasses.replace(base, **changes)).eval()


def write_ade20k(root: Path, n_train: int = 4, n_val: int = 2) -> Path:
    """An ADE20K-layout folder: 40x48 JPEGs, PNG label maps with 0 (ignore) and a few of the 150 classes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n, folder in (("training", n_train, "training"), ("validation", n_val, "validation")):
        (root / "images" / folder).mkdir(parents=True)
        (root / "annotations" / folder).mkdir(parents=True)
        for i in range(n):
            name = f"ADE_{split}_{i:08d}"
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(root / "images" / folder /
                                                                                    f"{name}.jpg")
            mask = np.zeros((40, 48), np.uint8)
            mask[:20] = 3
            mask[20:, :24] = 150
            Image.fromarray(mask).save(root / "annotations" / folder / f"{name}.png")
    return root


@contextlib.contextmanager
def bench_module(name: str):
    """``bench/<name>.py`` imported as module ``name`` (its own imports, e.g. ``record``, found beside it)."""
    import importlib.util

    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        spec = importlib.util.spec_from_file_location(name, bench / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(bench))
        sys.modules.pop(name, None)


def undecodable_shard(folder: Path, bad: bool = True) -> None:
    """``folder``/train-00000.parquet: 40 random 32² PNGs with two labels; every 4th is not an image (``bad``)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    rng = np.random.default_rng(0)

    def png() -> bytes:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    images = [png() if i % 4 or not bad else b"\x89PNG\r\n\x1a\n cut" for i in range(40)]
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.table({"image": images, "label": pa.array([i % 2 for i in range(40)], pa.int64()),
                             "path": [f"img{i}.png" for i in range(40)]}), folder / "train-00000.parquet")


class InLoaderProcess:
    """A map-style data set that raises when an item is read outside a DataLoader process (in the evaluating or
    training process itself)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        from torch.utils.data import get_worker_info

        if get_worker_info() is None:
            raise RuntimeError("an image decoded in the evaluating process")
        return self.dataset[i]


def decode_in_loader_processes(monkeypatch) -> None:
    """Make ``ropim.train.downstream``'s evaluation splits ``InLoaderProcess`` data sets."""
    from ropim.train import downstream

    splits = downstream.eval_splits
    monkeypatch.setattr(downstream, "eval_splits", lambda *args: tuple(InLoaderProcess(d) for d in splits(*args)))


def log_shard_reads(monkeypatch, log: Path) -> None:
    """Append "<pid> <file>" to ``log`` each time any process forked from here reads a Parquet shard's images."""
    from ropim.data import footers

    read = footers.read_columns

    def logged(fs, file, columns, **kwargs):
        if "image" in columns:
            with open(log, "a") as out:
                out.write(f"{os.getpid()} {file}\n")
        return read(fs, file, columns, **kwargs)

    monkeypatch.setattr(footers, "read_columns", logged)
