"""The jobs that watch the encoder they train on frozen features, every ``eval_every`` epochs (``FrozenEvalJob``:
pretrain, graft): a kNN top-1 and, on request, a linear probe's, the train split as memory bank and probe training
set. Imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass

from ropim.checks import COUNT, Range, check_knn_bank
from ropim.errors import ConfigError
from ropim.train.job import JobConfig, dataset_name

# train images a linear probe inside a job on several workers fits on at most: rank 0 fits it alone while the others
# wait in the next collective, which Ray Train's process group ends after 30 minutes; sklearn's L-BFGS over 1,000
# classes of 768 features makes ~1.5 MFLOP per image per iteration, so 100,000 images take minutes, 1.28 M hours
PROBE_IMAGES = 100_000


@dataclass(frozen=True)
class FrozenEvalJob(JobConfig):
    """A job scored by kNN (and a linear probe) of its encoder's frozen features on eval epochs."""

    RULES = {**JobConfig.RULES, "eval_every": Range(0, integer=True), "knn_k": COUNT,
             "eval_train_images": Range(1, integer=True, optional=True)}

    eval_linear_probe: bool = False
    """on eval epochs also fit a linear probe (ropim.eval.linear): linear_top1"""
    knn_k: int = 20
    """neighbours of the kNN top-1 evaluation (every eval_every epochs)"""
    eval_train_images: int | None = None
    """the kNN bank and the probe's training set: a sample of this many train images (the same at every evaluation
    and in every run on the same data; its scores are named with it: knn_top1@k=20,train=N); None: the whole split.
    At ImageNet size an evaluation beside training (rank 0 alone) extracts 1.28 M images: a sample makes it short"""

    def check_data(self) -> int:
        """Beyond the job's own checks, ``check_bank``; returns the training split's item count."""
        n = super().check_data()
        self.check_bank(n)
        return n

    def check_bank(self, train_items: int) -> None:
        """With evaluations, ``knn_k`` is at most the kNN's bank: the train split of ``train_items``, or its
        ``eval_train_images`` sample; a linear probe on several workers fits on ``PROBE_IMAGES`` at most."""
        if not self.eval_every:
            return
        bank = min(train_items, self.eval_train_images or train_items)
        sample = self.eval_train_images is not None and self.eval_train_images < train_items
        check_knn_bank(self.knn_k, bank, f"eval_train_images={self.eval_train_images}" if sample
                       else f"the train split of {self.data.source!r}")
        if self.eval_linear_probe and self.num_workers > 1 and bank > PROBE_IMAGES:
            raise ConfigError(f"eval_linear_probe=true on {bank:,} train images: rank 0 would fit the probe alone "
                              "while the other workers wait, past the 30 minutes after which Ray Train's process "
                              f"group fails the run; give --eval_train_images {PROBE_IMAGES // 2} (the probe and "
                              "kNN on a sample) or --eval_linear_probe false (and `ropim probe` on the encoder)")

    def scores_options(self) -> dict:
        """What this job sets of ``ropim.train.downstream.frozen_scores``' arguments: the data, k, the probe, the
        DataLoader processes that decode, the bank's sample."""
        return {"data": self.data, "knn_k": self.knn_k, "linear": self.eval_linear_probe,
                "processes": self.dataloader_workers, "train_images": self.eval_train_images}

    def version_scores(self, metrics: dict[str, float]) -> dict[str, float | str]:
        """``score.<data set>.<metric>`` of each frozen score the final epoch logged, its protocol beside the value
        (``score.digits.knn_top1``: ``57.94 (k=20)``; MLflow keys take no ``@`` or ``=``)."""
        out: dict[str, float | str] = {}
        for m in ("knn_top1", "linear_top1"):
            if m in metrics:
                protocol = self.protocol(m).partition("@")[2]
                out[f"score.{dataset_name(self.data)}.{m}"] = f"{metrics[m]:.2f}" + (f" ({protocol})" if protocol
                                                                                     else "")
        return out

    def protocol(self, metric: str) -> str:
        """``metric`` with what it depends on, e.g. ``knn_top1@k=20`` (k = 20 is not k = 10) or
        ``linear_top1@train=50000``: scores under one name compare (the champion rule, ``tune``). Other metrics (a
        fine-tune's top-1) depend on neither."""
        parts = [f"k={self.knn_k}"] * metric.startswith("knn")
        parts += [f"train={self.eval_train_images}"] * (self.eval_train_images is not None
                                                         and metric.startswith(("knn", "linear")))
        return f"{metric}@{','.join(parts)}" if parts else metric
