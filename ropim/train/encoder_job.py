"""The jobs that start from an encoder (``EncoderJob``: fine-tune, graft, segment), and among them those that train it
with a new head under layer-wise learning-rate decay (``TransferJob``: fine-tune, segment): the fields, rules and
encoder checks they share beside ``JobConfig``'s. Imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ropim.checks import COUNT, SHARE, Range, check_encoder_input, check_location
from ropim.errors import ConfigError
from ropim.paths import resolve_path
from ropim.tracking.names import DEFAULT_ENCODER_NAME
from ropim.train.job import JobConfig, dataset_name


@dataclass(frozen=True)
class EncoderJob(JobConfig):
    """A job that starts from an encoder (a registered version, a run's artifact or a local folder)."""

    encoder: str = f"models:/{DEFAULT_ENCODER_NAME}@champion"
    """models:/name/version, models:/name@alias, runs:/… or a local folder"""

    @property
    def run_prefix(self) -> str:
        return f"{self.kind}-{dataset_name(self.data)}"

    def size(self, config: dict) -> str:
        """The image size it trains at, for the run's first line (" at 32px"; ``config``: the encoder's)."""
        return ""

    def check_inputs(self) -> None:
        check_location(self.encoder, "encoder")
        super().check_inputs()

    def check_data(self) -> int:
        """The training split holds a global batch and the val split (every evaluation's) holds images; returns the
        training split's item count."""
        from ropim.data.sources import count_images

        n = super().check_data()
        if not count_images(self.data, "val"):
            raise ConfigError(f"data source={self.data.source!r}: the split holds no images")
        return n

    def pinned(self, uri: str, config: dict, pinned: str):
        """This config checked against the encoder ``uri`` it starts from (``config``: its config.json, ``depth`` the
        blocks of its weights) and fixed to ``pinned``, the version or folder it resolved to, so that every worker and
        a resumed run load the same one."""
        self.check_encoder(uri, config)
        return replace(self, encoder=pinned)

    def check_encoder(self, uri: str, config: dict) -> None:
        """The encoder (its ``config.json``) fits this job: RGB images at its own size. Needs no torch: the pre-flight
        runs it on a local folder's config, the job on every encoder's."""
        check_encoder_input(uri, config)

    def resolved(self):
        return replace(super().resolved(), encoder=resolve_path(self.encoder))


@dataclass(frozen=True)
class TransferJob(EncoderJob):
    """A job that trains an encoder with a new head under layer-wise lr decay, evaluated on the val split every
    ``eval_every`` epochs; ``random_init`` runs the same from the encoder's architecture alone (the from-scratch
    baseline)."""

    BATCH = "batch_size"
    RULES = {**EncoderJob.RULES, "batch_size": COUNT, "eval_every": COUNT, "layer_decay": Range(0, 1, low_open=True),
             "drop_path": Range(0, 1, high_open=True), "hflip": SHARE}

    random_init: bool = False
    """same architecture, encoder weights not loaded: the from-scratch baseline"""
    batch_size: int = 64
    """global: split over num_workers"""
    layer_decay: float = 0.75
    """each block's lr is this × the next one's (the head at the full rate)"""
    drop_path: float = 0.1
    """stochastic depth of the encoder"""
    hflip: float = 0.5
    """horizontal flip probability"""
    eval_every: int = 1
    """epochs between val evaluations (the last epoch always evaluates)"""
    log_every: int = 20
