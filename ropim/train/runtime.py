"""Where the training loop runs: the Ray session, the TorchTrainer of a job (``num_workers`` ≥ 1) or this process
(``num_workers`` = 0, ``ropim.train.inprocess``), seen by the loop through one ``Worker`` interface, with the same
checkpoint format.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ropim.data.sources import listings
from ropim.errors import ConfigError, input_line
from ropim.paths import cluster_note, is_uri, resolve_path
from ropim.tracking.run_meta import IN_PROCESS
from ropim.tracking.store import TrackingError
from ropim.train.commit_poll import quick_commits
from ropim.train.encoder_job import EncoderJob
from ropim.train.guard import Diverged, take_records
from ropim.train.inprocess import LocalWorker, RemoteWorker, downloaded
from ropim.train.job import JobConfig
from ropim.train.niceness import even_worker_priority
from ropim.train.ray_worker import RayWorker, on_ray
from ropim.train.snapshot import tidy
from ropim.train.stopping import fit_trainer, init_kept, shutdown_kept

WorkerFn = Callable[[dict, RayWorker | LocalWorker], None]


@contextlib.contextmanager
def ray_session(needed: bool = True, paths: dict[str, str] | None = None) -> Iterator[None]:
    """Use this process's Ray session, or (when ``needed``) start one and shut it down on exit.

    ``ray.init()`` joins the cluster of a ``ray job submit`` job (RAY_ADDRESS) or starts a local one. The
    dashboard stays on: Ray Train's placement-group cleaner needs its state API to free a dead run's resources.
    On joining a cluster of several nodes, one line names the local ``paths`` ({flag: path}) workers would open
    there (``ropim.paths.cluster_note``). A stop signal leaves the shut-down to Ray's exit hook, so that the run
    records its end first (``ray job stop`` kills the driver 3 s after its SIGTERM).
    """
    import ray

    started = needed and not ray.is_initialized()
    if started:
        even_worker_priority()  # a local cluster's workers at this process's priority, not Ray's nice 15
        with init_kept():
            ray.init(logging_level=logging.WARNING)  # the job's own lines, not Ray's start-up chatter
        note = cluster_note(paths or {}, sum(1 for n in ray.nodes() if n.get("Alive")))
        if note:
            print(note, flush=True)
    try:
        yield
    except KeyboardInterrupt:
        started = False
        raise
    finally:
        if started:
            shutdown_kept()


@dataclass
class FitResult:
    """A job's last reported metrics and its latest checkpoint (a Ray ``Checkpoint`` or a local folder)."""

    metrics: dict
    checkpoint: object | None

    @property
    def checkpoint_path(self) -> str | None:
        """Where the latest checkpoint is (a folder or a URI: a Ray checkpoint's path on remote storage lacks the
        scheme, e.g. ``bucket/runs/…`` for ``s3://bucket/runs/…``, and would read as a local folder)."""
        if self.checkpoint is None:
            return None
        path = str(getattr(self.checkpoint, "path", self.checkpoint))
        kind = getattr(getattr(self.checkpoint, "filesystem", None), "type_name", "local")
        scheme = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs", "abfs": "abfs"}.get(kind)
        return f"{scheme}://{path}" if scheme and "://" not in path else path

    @contextlib.contextmanager
    def checkpoint_dir(self) -> Iterator[Path]:
        """The latest checkpoint as a local folder (downloaded from remote storage when needed)."""
        if isinstance(self.checkpoint, Path):
            yield self.checkpoint
        elif isinstance(self.checkpoint, str):  # an in-process job's checkpoint on remote storage
            with downloaded(self.checkpoint) as d:
                yield d
        else:
            with self.checkpoint.as_directory() as d:
                yield Path(d)


def torch_trainer(fn: WorkerFn, loop_config: dict, job: JobConfig, *,
                  callbacks: list | None = None, datasets: dict | None = None, storage_path: str | None = None):
    """The TorchTrainer of a job: ``job.num_workers`` workers (elastic down to ``job.min_workers``) placed by
    ``job.placement_strategy``, a run named ``job.run_name`` under its storage path (re-running the name resumes from
    its latest checkpoint), ``keep_checkpoints``, ``max_failures``."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = storage_path or job.storage_path
    return TorchTrainer(
        functools.partial(on_ray, fn),
        train_loop_config=loop_config,
        datasets=datasets,
        scaling_config=ScalingConfig(num_workers=worker_count(job), use_gpu=job.use_gpu,
                                     resources_per_worker={"CPU": job.cpus_per_worker},
                                     placement_strategy=job.placement_strategy),
        run_config=RunConfig(
            name=job.run_name,
            storage_path=storage if is_uri(storage) else str(Path(storage).absolute()),
            checkpoint_config=CheckpointConfig(num_to_keep=job.keep_checkpoints),
            failure_config=FailureConfig(max_failures=job.max_failures),
            callbacks=callbacks or [],
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )


def worker_count(job: JobConfig) -> int | tuple[int, int]:
    """``num_workers``, or Ray Train's elastic ``(min_workers, num_workers)`` when ``min_workers`` is lower."""
    if job.min_workers is not None and job.min_workers < job.num_workers:
        return job.min_workers, job.num_workers
    return job.num_workers


def worker_paths(job: JobConfig) -> dict[str, str]:
    """The paths a job's workers open: {flag: path}."""
    return {"data.source": job.data.source, "storage_path": job.storage_path,
            **({"encoder": job.encoder} if isinstance(job, EncoderJob) else {})}


def run_dir(job: JobConfig, storage_path: str | None = None) -> str:
    """The run's folder (a URI, or an absolute local path: workers may run in another folder)."""
    storage = storage_path or job.storage_path
    return f"{resolve_path(storage)}/{job.run_name}"


def fit(fn: WorkerFn, loop_config: dict, job: JobConfig, **trainer_kwargs) -> FitResult:
    """Run ``fn`` on ``job.num_workers`` Ray Train workers, or in this process when it is 0; raise ``Diverged`` when
    the loop stopped on a non-finite loss (``ropim.train.guard``)."""
    folder = loop_config["run_dir"]
    take_records(folder)  # a stop or an input error recorded by an earlier job of this run is history
    tidy(folder, ray=job.num_workers > 0)  # Ray Train's list of the run's checkpoints made true
    try:
        result = run_fit(fn, loop_config, job, **trainer_kwargs)
    finally:
        stop = take_records(folder)
    if stop is not None:
        raise Diverged(stop["message"])
    return result


def run_fit(fn: WorkerFn, loop_config: dict, job: JobConfig, **trainer_kwargs) -> FitResult:
    """``fit`` without the divergence check."""
    if job.num_workers == 0:
        gpu_or_cpu(job.use_gpu)
        folder = f"{run_dir(job)}/{IN_PROCESS}"
        worker = (RemoteWorker(folder, job.keep_checkpoints, job.use_gpu) if is_uri(folder) else
                  LocalWorker(Path(folder), job.keep_checkpoints, job.use_gpu))
        fn(loop_config, worker)
        found = worker.checkpoints()
        return FitResult(worker.metrics, found[-1] if found else None)
    with ray_session(paths=worker_paths(job)):
        if listed := listings():  # the workers start from the driver's listings instead of listing again
            import ray

            loop_config = {**loop_config, "listings": ray.put(listed)}
        try:
            with quick_commits(job.num_workers):
                result = fit_trainer(torch_trainer(fn, loop_config, job, **trainer_kwargs))
        except Exception as err:
            bad = input_error(err) or worker_cause(err, lambda e: isinstance(e, TrackingError))
            if bad is None:
                raise
            raise bad from None  # one line, not a worker traceback (a restart stops at once: guard.input_error_met);
            # a store that did not take the last records: the driver says what the run kept
    return FitResult(dict(result.metrics or {}), result.checkpoint)


def worker_cause(err: BaseException, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first exception ``wanted`` accepts inside the error Ray hands the driver (worker failures, wrapped
    exceptions, task causes), or None."""
    todo, seen = [err], set()
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        if wanted(e):
            return e
        inner = [e.__cause__, e.__context__, getattr(e, "cause", None), *getattr(e, "args", ()),
                 getattr(e, "controller_failure", None), *getattr(e, "worker_failures", {}).values()]
        todo += [x for x in inner if isinstance(x, BaseException)]
    return None


def input_error(err: BaseException) -> ConfigError | None:
    """The ``ConfigError`` (a bad image under ``fail``, a shard cut short) a worker raised, found inside the error Ray
    hands the driver, with its one line (``ropim.errors.input_line``); None when the failure is something else."""
    found = worker_cause(err, lambda e: bool(input_line(e)))
    if found is None:
        return None
    return (type(found) if type(found).__module__.startswith("ropim.") else ConfigError)(input_line(found))


def gpu_or_cpu(use_gpu: bool) -> torch.device:
    """The device of an in-process job; ConfigError when a GPU is asked for and none is visible."""
    if use_gpu and not torch.cuda.is_available():
        raise ConfigError("use_gpu=true but no CUDA device is visible in this process; drop --use_gpu")
    return torch.device("cuda" if use_gpu else "cpu")
