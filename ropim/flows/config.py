"""What the composed commands are: ``ProbeConfig`` (``ropim probe``), ``TransferConfig`` (``ropim transfer``) and
``DemoConfig`` (``ropim demo``). Imports nothing heavy, so that the command line parses and validates fast."""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Literal

from ropim.checks import (
    COUNT,
    POSITIVE,
    SEED,
    Range,
    check_fields,
    check_folder,
    check_local_resources,
    check_mlflow_names,
    check_run_name,
)
from ropim.data.config import DataConfig
from ropim.errors import ConfigError
from ropim.paths import resolve_path
from ropim.tracking.names import DEFAULT_ENCODER_NAME
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.jobs import Prepared, prepare
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig


@dataclass(frozen=True)
class ProbeConfig:
    """Linear probe and kNN of a frozen encoder on one data set."""

    encoder: str = f"models:/{DEFAULT_ENCODER_NAME}@champion"
    """the encoder: models:/name/version, models:/name@alias, runs:/… or a local folder"""
    data: DataConfig = field(default_factory=DataConfig)
    """the images probed (``--data.*``)"""
    img_size: int | None = None
    """None: the encoder's; another size resamples the position embedding"""
    batch_size: int = 256
    """feature extraction"""
    knn_k: int = 20
    """neighbours of the kNN classifier"""
    knn_temperature: float = 0.07
    """temperature of the kNN vote's weights"""
    linear_c: float = 1.0
    """inverse L2 strength of the logistic regression (scikit-learn's C)"""
    linear_max_iter: int = 1000
    """solver iterations (ropim.eval.linear: Newton-Cholesky or L-BFGS)"""
    linear_threads: int | None = None
    """BLAS / OpenMP threads of the probe's fit (None: 1 for the exact solver of small probes, bit for bit the same
    on any machine; the machine's for L-BFGS)"""
    use_gpu: bool = False
    """extract features on a GPU"""
    dataloader_workers: int = 0
    """DataLoader processes"""
    cache_dir: str | None = None
    """keep extracted features here (safetensors), keyed by weights, data and size"""
    seed: int = 0
    """seeds the probe's fit"""
    experiment: str = "ropim-probe"
    """the MLflow experiment"""
    run_name: str | None = None
    """the MLflow run's name (None: the job, date and a suffix)"""

    def validate(self) -> ProbeConfig:
        """Raise ConfigError naming the bad field and its fix."""
        self.data.validate()
        check_fields(self, {"batch_size": COUNT, "knn_k": COUNT, "linear_max_iter": COUNT, "linear_c": POSITIVE,
                            "linear_threads": Range(1, integer=True, optional=True), "knn_temperature": POSITIVE,
                            "dataloader_workers": Range(0, integer=True), "seed": SEED,
                            "img_size": Range(1, integer=True, optional=True)})
        check_run_name(self.run_name)
        check_mlflow_names(self.experiment)
        if self.cache_dir is not None:
            check_folder(self.cache_dir, "--cache_dir")  # the features are written after they are extracted
        return self

    def check_resources(self) -> None:
        """A GPU, when asked for, is visible."""
        check_local_resources(0, 1, self.use_gpu, False)

    def resolved(self) -> ProbeConfig:
        """The same config with its local paths (encoder folder, data source, cache) absolute (``ropim.paths``)."""
        return dataclasses.replace(self, encoder=resolve_path(self.encoder), data=self.data.resolved(),
                                   cache_dir=resolve_path(self.cache_dir))

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TransferConfig:
    """Encoders × data sets; ``finetune`` / ``probe`` hold the settings every cell shares."""

    encoders: str = ""
    """comma-separated encoder URIs"""
    data: str = ""
    """comma-separated data sources ('digits', folders, URIs); other data fields from the templates"""
    mode: Literal["finetune", "probe"] = "finetune"
    """what every cell runs: a fine-tune or a linear probe and kNN"""
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    """what every fine-tune cell shares (``--finetune.*``)"""
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """what every probe cell shares (``--probe.*``)"""
    segment_data: str = ""
    """comma-separated segmentation sources: an mIoU column each, beside the classification"""
    segment: SegmentConfig = field(default_factory=SegmentConfig)
    """what every segmentation cell shares"""
    out: str = "transfer_results"
    """the folder of the results table (CSV, Markdown, JSON)"""

    @property
    def encoder_list(self) -> list[str]:
        return [e.strip() for e in self.encoders.split(",") if e.strip()]

    @property
    def data_list(self) -> list[str]:
        return [d.strip() for d in self.data.split(",") if d.strip()]

    @property
    def segment_list(self) -> list[str]:
        return [d.strip() for d in self.segment_data.split(",") if d.strip()]

    def segment_cells(self) -> list[tuple[str, str, SegmentConfig]]:
        """(encoder, segmentation source, config) of every segmentation cell, encoders outer; paths resolved."""
        return [(e, d, dataclasses.replace(self.segment, encoder=e, run_name=None,
                                           data=dataclasses.replace(self.segment.data, source=d)).resolved())
                for e in self.encoder_list for d in self.segment_list]

    def cells(self) -> list[tuple[str, str, FinetuneConfig | ProbeConfig]]:
        """(encoder, data source, config) of every cell, encoders outer."""
        template = self.finetune if self.mode == "finetune" else self.probe
        return [(e, d, dataclasses.replace(template, encoder=e, data=dataclasses.replace(template.data, source=d),
                                           run_name=None))
                for e in self.encoder_list for d in self.data_list]

    def validate(self) -> TransferConfig:
        """Raise ConfigError naming the bad field; every cell's config is checked before any run starts."""
        check_fields(self, {})  # mode: one of its values
        if not self.encoder_list:
            raise ConfigError("encoders is empty: give --encoders URI1,URI2,…")
        if not self.data_list and not self.segment_list:
            raise ConfigError("data is empty: give --data SOURCE1,SOURCE2,… (e.g. digits or folders) and/or "
                              "--segment_data SOURCE1,… (segmentation sources)")
        for flag, items in (("encoders", self.encoder_list), ("data", self.data_list),
                            ("segment_data", self.segment_list)):
            if twice := next((x for i, x in enumerate(items) if x in items[:i]), None):
                raise ConfigError(f"--{flag} lists {twice!r} twice: each cell would run again for one column or row "
                                  "of the table; list it once")
        for _, _, cfg in [*self.cells(), *self.segment_cells()]:
            cfg.validate()
        return self

    def check_resources(self) -> None:
        """The cells' workers fit where they will run."""
        (self.finetune if self.mode == "finetune" else self.probe).check_resources()
        if self.segment_list:
            self.segment.check_resources()

    def resolved(self) -> TransferConfig:
        """The same config with every local path (encoders, data sources, templates, out) absolute."""
        return dataclasses.replace(self, encoders=",".join(resolve_path(e) for e in self.encoder_list),
                                   data=",".join(resolve_path(d, ("digits",)) for d in self.data_list),
                                   finetune=self.finetune.resolved(), probe=self.probe.resolved(),
                                   out=resolve_path(self.out))


@dataclass(frozen=True)
class DemoConfig:
    """A pretraining run and the fine-tune that scores it."""

    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    """what every fine-tune cell shares (``--finetune.*``)"""


def prepare_demo(cfg: DemoConfig) -> tuple[DemoConfig, Prepared]:
    """The demo's pre-flight, before torch or Ray is imported: its local paths absolute, the pretraining prepared
    (``ropim.train.jobs.prepare``: validated once, the tracking store, the training split), the fine-tune's own
    fields validated and its workers fitting (the encoder it starts from is the pretraining's, checked when it runs)."""
    cfg = DemoConfig(cfg.pretrain.resolved(), cfg.finetune.resolved())
    cfg.finetune.validate().check_resources()
    return cfg, prepare(cfg.pretrain)
