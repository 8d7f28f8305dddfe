"""``frozen_scores`` split over workers: two gloo processes each extract half of the digits' images, join their kNN
candidates and the probe's features, and rank 0 reports the scores one process computes over all of them."""

from __future__ import annotations

import pytest
import timm
import torch
from gloo_loop import GlooWorker
from support import decode_in_loader_processes, gloo_rank, log_shard_reads, on_two_ranks

from ropim.data.config import DataConfig
from ropim.data.datasets import eval_splits
from ropim.data.sampling import contiguous_share
from ropim.train.downstream import frozen_scores, joined


def tiny_encoder() -> torch.nn.Module:
    """The same random ViT in every process (seeded): 32² digits, 4×4 patches, 2 blocks."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=2, num_classes=0)


SAMPLED = 300  # train images in the kNN bank of the sampled evaluation


class Receiving(GlooWorker):
    """A gloo worker that counts the rows of features (192 wide: ViT-T's) it receives from the workers."""

    rows = 0

    def gather(self, values: torch.Tensor) -> torch.Tensor:
        return self.count(super().gather(values))

    def gather_to_first(self, values: torch.Tensor) -> torch.Tensor | None:
        return self.count(super().gather_to_first(values))

    def count(self, got: torch.Tensor | None) -> torch.Tensor | None:
        if got is not None and got.dim() == 3 and got.shape[-1] == 192:
            self.rows += got.shape[0] * got.shape[1]
        return got


def two_rank_scores(rank: int, init: str, out) -> None:
    """Rank ``rank`` of 2: the split scores, ``joined`` of items 0…6 (rank 0 holds 0…2, rank 1 3…6) on every worker and
    on rank 0 alone, and the feature rows the worker received; puts them or the error."""
    with gloo_rank(rank, init, out):
        torch.set_num_threads(1)
        worker = Receiving(rank, 2)
        items = [joined(worker, torch.tensor(contiguous_share(7, rank, 2)), 7).tolist()]
        first = joined(worker, torch.tensor(contiguous_share(7, rank, 2)), 7, first=True)
        items.append(first.tolist() if first is not None else None)
        scores = frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20, worker=worker)
        rows = worker.rows
        scores["sampled"] = frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20, linear=False,
                                          worker=worker, train_images=SAMPLED).get("knn_top1")
        out.put((rank, scores, (items, rows)))


def test_scores_split_over_two_workers_are_those_of_one_process(tmp_path):
    got = on_two_ranks(two_rank_scores, tmp_path)
    assert all(isinstance(got[rank][0], dict) for rank in (0, 1)), got  # else a worker's traceback
    (everywhere, first), received = got[0][1]
    assert everywhere == got[1][1][0][0] == first == list(range(7))  # every worker's share joined in the items' order
    assert got[1][1][0][1] is None  # joined on rank 0 alone
    assert got[1][0] == {"sampled": None}  # rank 0 reports
    train, val = (len(split) for split in eval_splits(DataConfig(source="digits"), 32))
    # both hold every val feature (each scores all of val against its share of the bank); the probe's train features
    # reach rank 0 alone (before: every worker, ~3.9 GB each at ImageNet-1k's 1.28 M images × ViT-B's 768)
    assert got[1][1][1] == val + val % 2 and received == got[1][1][1] + train + train % 2
    torch.set_num_threads(1)
    whole = frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20)
    split = got[0][0]
    sampled = frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20, linear=False,
                            train_images=SAMPLED)["knn_top1"]
    assert split.pop("sampled") == pytest.approx(sampled, abs=100 / 360 + 1e-9)  # a sample of the bank: the same one
    assert set(split) == {"knn_top1", "linear_top1"}
    # a random ViT on digits: far above chance (10%); the same scores (features of an image equal to float rounding)
    assert split["knn_top1"] > 30 and split == pytest.approx(whole, abs=100 / 360 + 1e-9), (split, whole)


def test_a_sampled_bank_holds_that_many_train_images():
    """``train_images=1``: every val image's nearest train image is the one sampled, so kNN top-1 is the share of val
    images of its class; the whole bank scores far above it."""
    from ropim.data.sampling import sample

    data = DataConfig(source="digits")
    train, val = eval_splits(data, 32)
    label = train[int(sample(len(train), 1)[0])][1]
    share = 100 * sum(val[i][1] == label for i in range(len(val))) / len(val)
    torch.set_num_threads(1)
    one = frozen_scores(tiny_encoder(), 32, data, knn_k=20, linear=False, train_images=1)
    assert one == {"knn_top1": pytest.approx(share)}
    assert frozen_scores(tiny_encoder(), 32, data, knn_k=20, linear=False)["knn_top1"] > share + 20


def test_images_decode_in_dataloader_processes_to_the_same_scores(monkeypatch):
    torch.set_num_threads(1)
    here = frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20, linear=False)
    decode_in_loader_processes(monkeypatch)
    with pytest.raises(RuntimeError, match="decoded in the evaluating process"):
        frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20, linear=False)
    # a job's dataloader_workers decode: the images in their order, the same scores
    assert frozen_scores(tiny_encoder(), 32, DataConfig(source="digits"), knn_k=20, linear=False, processes=2) == here


def test_parquet_shards_are_read_about_once_by_an_evaluations_processes(tmp_path, monkeypatch):
    """An evaluation over Parquet shards, decoded in 2 DataLoader processes: each pass reads each shard about once,
    the processes keeping a few (``KEPT_FILES``), and scores as in one process."""
    from ropim.data.convert import convert

    convert(DataConfig(source="digits"), str(tmp_path / "shards"), shard_size=40, progress=False)
    log = tmp_path / "reads.log"
    log_shard_reads(monkeypatch, log)
    torch.set_num_threads(1)
    data = DataConfig(str(tmp_path / "shards"))
    scores = frozen_scores(tiny_encoder(), 32, data, knn_k=20, linear=False, processes=2)
    reads = log.read_text().splitlines()
    files = len(list((tmp_path / "shards").glob("*.parquet")))
    assert len({r.split()[0] for r in reads}) == 4  # 2 processes a split, none in this one
    assert len(reads) <= 2 * files + 8, (len(reads), files)  # the splits are seeded fractions of the same shards
    assert scores == frozen_scores(tiny_encoder(), 32, data, knn_k=20, linear=False)
