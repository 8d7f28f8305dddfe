"""A job reads each Parquet footer once: pre-flight, opening the source, listing its splits, the loaders and every
evaluation share what was read."""

from __future__ import annotations

import collections

import pyarrow.parquet as pq
import pytest
from support import tiny_pretrain

from ropim.data import footers
from ropim.data.config import DataConfig
from ropim.data.convert import convert
from ropim.train.driver import run


@pytest.fixture
def footer_reads(monkeypatch) -> collections.Counter:
    """Every read of a shard that reads its footer (pyarrow's readers, a ParquetFile opened without one), by file."""
    reads: collections.Counter = collections.Counter()

    def counted(fn, footer_given=lambda kwargs: False):
        def wrapper(path, *args, **kwargs):
            if not footer_given(kwargs):
                reads[str(path).rsplit("/", 1)[-1]] += 1
            return fn(path, *args, **kwargs)
        return wrapper

    for name in ("read_metadata", "read_schema", "read_table"):
        monkeypatch.setattr(pq, name, counted(getattr(pq, name)))
    monkeypatch.setattr(pq, "ParquetFile", counted(pq.ParquetFile, lambda kwargs: kwargs.get("metadata") is not None))
    return reads


def test_a_pretraining_with_an_evaluation_every_epoch_reads_each_footer_once(workdir, footer_reads):
    shards = workdir / "digits-shards"
    convert(DataConfig(source="digits"), str(shards), shard_size=400)
    footers.FOOTERS.clear()
    footer_reads.clear()
    cfg = tiny_pretrain(data=DataConfig(source="digits-shards"), num_workers=0, epochs=2, eval_every=1,
                        run_name="footers", registered_model="")
    result = run(cfg)
    assert result.metrics["epoch"] == 2 and "knn_top1" in result.metrics  # listed, trained, evaluated twice
    files = sorted(p.name for p in shards.glob("*.parquet"))
    assert len(files) == 5 and dict(footer_reads) == dict.fromkeys(files, 1)


def test_a_shard_written_again_is_read_again(tmp_path, footer_reads):
    import pyarrow as pa
    import pyarrow.fs as pafs

    path, fs = str(tmp_path / "s.parquet"), pafs.LocalFileSystem()
    pq.write_table(pa.table({"label": [0, 1]}), path)
    assert footers.num_rows(fs, path) == footers.num_rows(fs, path) == 2 and footer_reads["s.parquet"] == 1
    pq.write_table(pa.table({"label": [0, 1, 2]}), path)
    assert footers.num_rows(fs, path) == 3 and footer_reads["s.parquet"] == 2


def test_inside_a_jobs_listing_a_footer_is_checked_once_not_at_every_use(tmp_path, footer_reads):
    """On S3 each check of a shard is a request: 1,332 ImageNet shards checked at every open, listing and evaluation
    took minutes. Inside ``one_listing`` (a job, on its driver and each worker) a shard is checked once; the next
    job checks it again, and reads it again when it was written again."""
    import fsspec
    import pyarrow as pa
    import pyarrow.fs as pafs

    from ropim.data.sources import one_listing

    checks = collections.Counter()

    class Counted(pafs.FSSpecHandler):
        def get_file_info(self, paths):
            checks.update(paths)
            return super().get_file_info(paths)

    fs, path = pafs.PyFileSystem(Counted(fsspec.filesystem("file"))), str(tmp_path / "s.parquet")
    pq.write_table(pa.table({"label": [0, 1]}), path)
    with one_listing():
        assert [footers.num_rows(fs, path) for _ in range(3)] == [2, 2, 2]
    assert checks[path] == 1 and footer_reads["s.parquet"] == 1
    pq.write_table(pa.table({"label": [0, 1, 2]}), path)
    with one_listing():  # the next job
        assert [footers.num_rows(fs, path) for _ in range(2)] == [3, 3]
    assert checks[path] == 2 and footer_reads["s.parquet"] == 2
