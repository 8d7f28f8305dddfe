"""The Task base (``ropim.train.task``): the epoch line's ETA counts what happens between epochs (evaluations,
checkpoints, pictures), not only the epoch's training time; the measured period is what the step lines use."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import torch
from gloo_loop import ToyJob
from PIL import Image
from support import log_shard_reads

from ropim.data.config import DataConfig
from ropim.data.datasets import build_dataset, eval_transform
from ropim.train import task as task_module
from ropim.train.task import Task, bad_images


class LineTask(Task):
    """A task that only says its epoch lines."""

    CONFIG = ToyJob

    def build(self, worker):
        raise NotImplementedError

    def data(self, worker, micro_batch):
        raise NotImplementedError

    def loss(self, model, batch, step):
        raise NotImplementedError

    def epoch_end(self, model, metrics):
        self.log_epoch(metrics, f"loss {metrics['loss']:.4f}")


def etas(monkeypatch, caplog, lines: list[tuple[int, float]]) -> tuple[list[str], float | None]:
    """The ETAs a 300-epoch job's lines say, each line (epoch, its time on the clock) of an epoch that trained in
    60 s; and the epoch period the task then hands the loop's step lines."""
    task = LineTask({"cfg": ToyJob(epochs=300).to_dict(), "run_id": "r", "tracking_uri": "t", "run_dir": "d"},
                    worker=None)
    clock = iter(at for _, at in lines)
    monkeypatch.setattr(task_module.time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="ropim.train"):
        for epoch, _ in lines:
            task.epoch_end(None, {"epoch": epoch, "loss": 1.0, "img_per_s": 10.0, "epoch_time_s": 60.0,
                                  "peak_rss_mb": 1024})
    return [r.getMessage().split(" ETA ")[1].split(",")[0] for r in caplog.records], task.epoch_period


def test_the_eta_counts_the_time_between_epoch_lines(monkeypatch, caplog):
    # 60 s of training, then 30 s of evaluation and checkpoint each epoch: 90 s from line to line
    assert etas(monkeypatch, caplog, [(1, 1000.0), (2, 1090.0), (3, 1180.0)]) == (["5.0 h", "7.5 h", "7.4 h"], 90.0)


def test_a_resumed_process_measures_from_its_own_first_line(monkeypatch, caplog):
    # resumed at epoch 100: the first line has only its training time; then 120 s from line to line
    assert etas(monkeypatch, caplog, [(101, 5.0), (102, 125.0), (103, 245.0)]) == (["3.3 h", "6.6 h", "6.6 h"], 120.0)



def test_workers_waiting_for_their_images_are_told_once_what_to_raise(caplog):
    task = LineTask({"cfg": ToyJob(epochs=300, dataloader_workers=2).to_dict(), "run_id": "r", "tracking_uri": "t",
                     "run_dir": "d"}, worker=None)
    line = {"loss": 1.0, "img_per_s": 10.0, "peak_rss_mb": 1024}
    with caplog.at_level(logging.INFO, logger="ropim.train"):
        task.epoch_end(None, {**line, "epoch": 1, "epoch_time_s": 20.0, "data_wait_share": 0.4})  # 8 s: start-up
        task.epoch_end(None, {**line, "epoch": 2, "epoch_time_s": 60.0, "data_wait_share": 0.2})  # 12 s, 20%
        task.epoch_end(None, {**line, "epoch": 3, "epoch_time_s": 60.0, "data_wait_share": 0.45})
        task.epoch_end(None, {**line, "epoch": 4, "epoch_time_s": 60.0, "data_wait_share": 0.5})
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == ["[toy] epoch 3: the workers waited for their images 45% of the epoch (data_wait_share in MLflow): "
                    "the images decode slower than the model trains; decode in more processes: --dataloader_workers "
                    "(now 2; each worker needs the CPUs for them: --cpus_per_worker, now 1) (said once)"]


def test_ray_datas_decode_tasks_that_do_not_keep_up_ask_for_cpus():
    from ropim.train.pretrain.config import PretrainConfig

    note = task_module.starving_note(PretrainConfig(ingest="ray_data", cpus_per_worker=0.5),
                                     {"epoch_time_s": 100.0, "data_wait_share": 0.6})
    assert note.endswith("Ray Data's decode tasks do not keep up; leave them more of the cluster's CPUs (a smaller "
                         "--cpus_per_worker, now 0.5) or use --ingest torch with --dataloader_workers")


def test_bad_images_skipped_in_the_loaders_processes_are_counted(tmp_path):
    """With ``dataloader_workers`` > 0 the images are decoded in the DataLoader's processes: the epoch's
    ``bad_images`` counts the ones they skipped, each once (before: 0, the count stayed in each of those processes)."""
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(8):
            Image.new("RGB", (8, 8), (30 * i, 0, 0)).save(tmp_path / c / f"{i:02d}.png")
            if i % 3 == 0:  # not two in a row: a skip moves on to the next file, a good one
                (tmp_path / c / f"{i:02d}x.png").write_bytes(b"not an image")
    dataset = build_dataset(DataConfig(str(tmp_path), val_fraction=0.1), "train", eval_transform(8), 8)
    expected = sum(p.endswith("x.png") for p in dataset.paths)
    job = ToyJob(dataloader_workers=2, global_batch_size=2, accum_steps=1)
    task = LineTask({"cfg": job.to_dict(), "run_id": "r", "tracking_uri": "t", "run_dir": "d"},
                    worker=SimpleNamespace(rank=0, world=1, local_world=1, device=torch.device("cpu")))
    data = task.sharded(dataset, 1, {"bad_images": bad_images(dataset)})
    for epoch in range(2):  # the loader's processes start anew each epoch: a bad image still counts once
        images = sum(len(x) for x, _ in data.batches(epoch))
        assert expected >= 3 and images == len(dataset)
        assert data.stats["bad_images"][0]() == expected


def test_parquet_shards_are_read_once_an_epoch_by_the_loaders_processes(tmp_path, monkeypatch):
    """Training on Parquet shards with DataLoader processes: each shard is read about once an epoch, by one process,
    which keeps a few (before: a permutation made every process read and keep every shard, the whole data set's
    bytes in each: at ImageNet's ~140 GB, more than a node holds)."""
    from ropim.data.convert import convert
    from ropim.data.formats.parquet_rows import KEPT_FILES

    convert(DataConfig(source="digits"), str(tmp_path / "shards"), shard_size=40, progress=False)
    dataset = build_dataset(DataConfig(str(tmp_path / "shards")), "train", eval_transform(8), 8)
    log = tmp_path / "reads.log"
    log_shard_reads(monkeypatch, log)
    job = ToyJob(dataloader_workers=2, global_batch_size=16, accum_steps=1)
    task = LineTask({"cfg": job.to_dict(), "run_id": "r", "tracking_uri": "t", "run_dir": "d"},
                    worker=SimpleNamespace(rank=0, world=1, local_world=1, device=torch.device("cpu")))
    data = task.sharded(dataset, 16, {})
    assert sum(len(ys) for _, ys in data.batches(0)) == len(dataset) // 16 * 16  # the epoch whole
    reads = [line.split() for line in log.read_text().splitlines()]
    files = len(dataset.images.files)
    assert files >= 30 and len({pid for pid, _ in reads}) == 2 and dataset.images.cache_files == KEPT_FILES
    assert len(reads) <= files + 2 * KEPT_FILES, (len(reads), files)  # about once each (before: 2 × files)


def test_shards_too_large_for_the_nodes_loader_processes_are_said_once(tmp_path, monkeypatch, caplog):
    """Each loader process keeps up to ``KEPT_FILES`` Parquet shards' images: shards of 500 MB read by 8 processes of
    8 workers keep 128 GB on a node. The first epoch says so when that is a quarter of the node's memory or more
    (before: nothing, until the kernel killed a worker)."""
    from ropim.data.convert import convert

    convert(DataConfig(source="digits"), str(tmp_path / "shards"), shard_size=40, progress=False)
    dataset = build_dataset(DataConfig(str(tmp_path / "shards")), "train", eval_transform(8), 8)
    kept = dataset.images.kept_bytes()
    images = dataset.images  # the rows the train split takes of each shard
    taken = sorted(sum(map(len, images.column(f, "image").take(rows).to_pylist()))
                   for f, rows in enumerate(images.rows))
    assert 0.9 * sum(taken[-4:]) <= kept <= 1.1 * sum(taken[-4:])  # the 4 largest shards' share, from footers alone
    job = ToyJob(dataloader_workers=2, global_batch_size=16, accum_steps=1)
    worker = SimpleNamespace(rank=0, world=8, local_world=4, device=torch.device("cpu"))
    task = LineTask({"cfg": job.to_dict(), "run_id": "r", "tracking_uri": "t", "run_dir": "d"}, worker=worker)
    caplog.set_level(logging.WARNING, logger="ropim.train")
    for memory in (4 * 8 * kept, 4 * 8 * kept + 1):  # 8 processes on the node (4 workers × 2): 25%, then less
        monkeypatch.setattr(task_module.psutil, "virtual_memory", lambda total=memory: SimpleNamespace(total=total))
        task.sharded(dataset, 16, {})
    said = [r.getMessage() for r in caplog.records if "keeps up to 4" in r.getMessage()]
    assert len(said) == 1 and "for the 8 such processes of the 4 worker(s) on this node, 25% of its memory" in said[0]
    assert "--shard-size 1000" in said[0]


def test_a_worker_count_not_dividing_the_batch_keeps_the_runs_steps_per_epoch():
    """An elastic restart on 3 workers of a run of batch 16 (micro batch 5 each, global 15): as many optimizer steps
    an epoch as on 1, 2 or 4 workers, so the schedule keeps its length (before: 95 on 3, 89 on the others)."""
    dataset = build_dataset(DataConfig(source="digits"), "train", eval_transform(8), 8)
    job = ToyJob(global_batch_size=16, accum_steps=1)
    steps = {}
    for world in (1, 2, 3, 4):
        worker = SimpleNamespace(rank=world - 1, world=world, local_world=world, device=torch.device("cpu"))
        task = LineTask({"cfg": job.to_dict(), "run_id": "r", "tracking_uri": "t", "run_dir": "d"}, worker=worker)
        steps[world] = task.sharded(dataset, 16 // world, {}).steps
    assert steps == dict.fromkeys((1, 2, 3, 4), len(dataset) // 16)
