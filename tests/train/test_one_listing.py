"""A job lists its data once in each process (``one_listing``): the pre-flight, the datasets, every evaluation and the
pictures share one listing. Before, the driver walked an ImageFolder three times before step 1 (pre-flight, the
training split's count, the Ray dataset) and rank 0 walked it again for the pictures and at every evaluation: at
1.28 M files, seconds each on a local disk and minutes on a network file system."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from support import tiny_pretrain

from ropim.data.config import DataConfig
from ropim.data.formats import imagefolder
from ropim.data.sources import one_listing, open_source


def pixels(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)


def tree(root, per_class: int = 24):
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(pixels(i + 100 * (c == "b"))).save(root / c / f"{i:02d}.png")
    return root


@pytest.fixture
def listings(monkeypatch) -> list[str]:
    """The sources ImageFolder lists from now on, one entry a listing."""
    calls, real = [], imagefolder.source
    monkeypatch.setattr(imagefolder, "source", lambda cfg, *a: calls.append(cfg.source) or real(cfg, *a))
    return calls


def test_one_listing_a_block_lists_once_and_the_next_sees_new_files(tmp_path, monkeypatch, listings):
    tree(tmp_path / "imgs")
    monkeypatch.chdir(tmp_path)
    with one_listing():
        first = open_source(DataConfig(source="imgs"))
        with one_listing():  # a job's run inside its command's block: the outer block's listing
            assert open_source(DataConfig(source=str(tmp_path / "imgs"))) is first  # the same folder, absolute
        half = open_source(DataConfig(source="imgs", val_fraction=0.5))
        assert half is not first  # another split: its own
    assert len(listings) == 2
    with one_listing():
        outer = open_source(DataConfig(source="imgs"))
        with one_listing({(DataConfig(source="imgs", val_fraction=0.5).resolved(), 32): half}):  # handed listings
            assert open_source(DataConfig(source="imgs", val_fraction=0.5)) is half  # joined the outer block's
            assert open_source(DataConfig(source="imgs")) is outer  # the outer block's kept
    assert len(listings) == 3  # before: the handed listing ignored inside an outer block, the folder walked again
    Image.fromarray(pixels(7)).save(tmp_path / "imgs" / "a" / "new.png")
    again = open_source(DataConfig(source="imgs"))  # outside a block: listed again, the new file in it
    assert len(listings) == 4
    assert sum(len(again.split(s)) for s in ("train", "val")) == sum(len(first.split(s)) for s in ("train", "val")) + 1


def test_a_job_lists_its_image_folder_once(workdir, listings):
    from ropim.train.driver import run

    tree(workdir / "imgs")
    result = run(tiny_pretrain(run_name="listed-once", num_workers=0, data=DataConfig(source="imgs"), epochs=3,
                               eval_every=1, max_steps_per_epoch=1, viz_every=3))
    assert result.metrics["epoch"] == 3 and "knn_top1" in result.metrics  # every epoch evaluated, pictures drawn
    assert len(listings) == 1, listings  # before: 7 (pre-flight, count, dataset, pictures, 3 evaluations)


class Handed(Exception):
    """Stops a job once it has built its Ray trainer."""


def test_ray_workers_start_from_the_drivers_listing(workdir, ray_session, listings, monkeypatch):
    """On Ray Train the driver hands its listings to the workers (a Ray object): a worker that starts from them
    lists nothing. Before, each worker walked the folder again (16 workers of a fine-tune: 16 walks of ImageNet)."""
    import ray

    from ropim.train import runtime
    from ropim.train.driver import run

    tree(workdir / "ray-imgs")
    handed = {}

    def trainer(fn, loop_config, job, **kwargs):
        handed.update(loop_config)
        raise Handed

    monkeypatch.setattr(runtime, "torch_trainer", trainer)
    with pytest.raises(Handed):
        run(tiny_pretrain(run_name="handed", num_workers=1, cpus_per_worker=0.5, data=DataConfig(source="ray-imgs")))
    listed = ray.get(handed["listings"])
    assert [key[0].source for key in listed] == [str(workdir / "ray-imgs")] and len(listings) == 1
    (key, driver_source), = listed.items()
    with one_listing(listed):  # as worker_main starts
        source = open_source(DataConfig(source=str(workdir / "ray-imgs")), key[1])
    assert len(listings) == 1 and source.split("train").paths == driver_source.split("train").paths
