"""The one job driver: ``prepare`` (``ropim.train.jobs``: the config checked once) → pin the encoder the job starts
from → open or continue its MLflow run → train on ``num_workers`` Ray Train workers or in this process → register its
result once the last epoch is done | mark the run stopped. Every job and every sweep trial runs through ``run``;
``worker_main`` is every job's worker.

Re-running a named run (same ``run_name`` and ``storage_path``) continues it from its latest checkpoint with the same
step count, schedule and MLflow run; re-running a finished one reports it and trains and registers nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ropim.checks import waiting_note
from ropim.console import ensure_logging
from ropim.data.sources import one_listing
from ropim.errors import ConfigError, JobFailed, first_line
from ropim.paths import is_uri, job_copy_note
from ropim.tracking import registry, store
from ropim.tracking.encoders import resolve_encoder
from ropim.tracking.model_folder import MixedKinds
from ropim.tracking.runs import Run, open_run
from ropim.tracking.signals import STOP
from ropim.train.checkpoint import ROOM, NoRoom, enospc
from ropim.train.downstream import run_tags
from ropim.train.encoder_job import EncoderJob
from ropim.train.failures import failure_reason
from ropim.train.guard import input_error_met, write_input_error
from ropim.train.inprocess import downloaded
from ropim.train.job import JobConfig, dataset_name
from ropim.train.jobs import JOBS, Prepared, prepare
from ropim.train.loop import train
from ropim.train.runtime import FitResult, WorkerFn, fit, input_error, ray_session, run_dir, worker_cause, worker_paths
from ropim.train.snapshot import remove_uncommitted
from ropim.train.task import Worker


def worker_main(config: dict, worker: Worker) -> None:
    """One worker of any job: its Task (``config["job"]`` names the job) on the one loop, in one listing of its data
    that starts from the driver's (``config["listings"]``, a Ray object: a source the driver listed is not walked
    again by each worker)."""
    listed = config.get("listings")
    if listed is not None:
        import ray

        listed = ray.get(listed)
    if (met := input_error_met(config["run_dir"])) is not None:  # a restarted attempt: the same input fails again
        raise met
    with one_listing(listed):
        task = JOBS[config["job"]].load("task")(config, worker)
        try:
            train(task, task.cfg, worker)
        except Exception as err:
            if (bad := input_error(err)) is not None:
                write_input_error(config["run_dir"], bad)
            raise


@dataclass(frozen=True)
class JobResult:
    """Where a job left its outputs."""

    run_id: str
    run_name: str
    model_uri: str | None  # what it registered; None while the run is unfinished or when it registers nothing
    checkpoint_path: str | None  # its latest checkpoint: a folder or a URI
    metrics: dict  # the last epoch's (a run finished earlier: the latest values MLflow holds)
    earlier: bool = False  # the run had finished in an earlier job: reported, nothing trained or registered now

    @contextlib.contextmanager
    def checkpoint_dir(self) -> Iterator[Path]:
        """The latest checkpoint as a local folder (downloaded from remote storage when needed)."""
        if is_uri(self.checkpoint_path):
            with downloaded(self.checkpoint_path) as folder:
                yield folder
        else:
            yield Path(self.checkpoint_path)


@one_listing()  # the pre-flight's listing serves the run's datasets
def run(job: JobConfig | Prepared, *, worker_fn: WorkerFn = worker_main, register: bool = True,
        run_options: dict | None = None, **trainer_kwargs) -> JobResult:
    """Run a job (a config, or what ``prepare`` made of it): train (or continue) its run, then register its result.

    ``register=False`` leaves the registry alone (a sweep trial); ``run_options`` replace what the run is opened with
    (``open_run``'s experiment, title, tags, lock, resume, …); ``trainer_kwargs`` go to the TorchTrainer (e.g.
    ``callbacks=[TuneReportCallback()]`` inside a Ray Tune trial)."""
    ensure_logging()
    p = pin(job if isinstance(job, Prepared) else prepare(job))
    cfg = p.cfg
    options = {"experiment": cfg.experiment, "tags": tags(p), "config_artifact": p.job.artifact,
               "resumable": cfg.RESUMABLE, "resume": p.resume_hint,
               "normalize": lambda stored: type(cfg).from_dict(stored).resolved().to_dict(), **(run_options or {})}
    with contextlib.ExitStack() as ray_up:
        ray_up.enter_context(ray_session(needed=cfg.num_workers > 0, paths=worker_paths(cfg)))
        if cfg.num_workers > 0:  # a cluster joined by address, seen once connected: refused before the run opens
            cpus, gpus, cluster = cluster_resources()
            cfg.check_cluster(cpus, gpus, cluster)
            if note := waiting_note(cfg.num_workers, cfg.cpus_per_worker, cfg.use_gpu, cpus, gpus, cluster):
                print(f"[{cfg.kind}] {note}", flush=True)
        with open_run(name=cfg.run_name, storage_path=cfg.storage_path, config=cfg.to_dict(), uri=p.tracking,
                      **options) as mlflow_run:
            if mlflow_run.finished:
                return reported(p, mlflow_run)
            where = "in this process" if cfg.num_workers == 0 else f"on {cfg.num_workers} Ray Train workers"
            print(f"[{cfg.kind}] run {cfg.run_name} {where}: {source(p)}, MLflow run {mlflow_run.run_id} at "
                  f"{p.tracking}", flush=True)
            if note := job_copy_note(cfg.storage_path):
                print(note, flush=True)
            result = fit_run(p, mlflow_run, worker_fn, trainer_kwargs)
            ray_up.close()  # Ray shut down before the result is registered
            return finish(p, mlflow_run, result, register)


def fit_run(p: Prepared, mlflow_run: Run, worker_fn: WorkerFn, trainer_kwargs: dict) -> FitResult:
    """Fit the job of an open run. A failure's reason is tagged on the run (``ropim.failure``); one in Ray's machinery
    rather than the job's code or input (Ray Train's controller, an actor killed by Ray's memory monitor; not a worker
    failure, Ray's ``WorkerGroupError``) becomes ``JobFailed``, one line (``failed``)."""
    cfg = p.cfg
    folder = run_dir(cfg)
    try:
        inputs, datasets = p.job.load("task").inputs(cfg)
        config = {"job": p.job.name, "cfg": cfg.to_dict(), "run_id": mlflow_run.run_id, "tracking_uri": p.tracking,
                  "run_dir": folder, **inputs}
        return fit(worker_fn, config, cfg, datasets=datasets, **trainer_kwargs)
    except store.TrackingError as err:  # the store (down) did not take the last records: nothing to tag it with
        raise JobFailed(unrecorded(p, "its last epochs' records", err,
                                   " (the latest holds the records the store did not take)")) from None
    except NoRoom as err:
        raise out_of_room(p, mlflow_run, err) from None
    except Exception as err:
        if (disk := worker_cause(err, enospc)) is not None:  # Ray's own write (its controller's state, async uploads)
            room = NoRoom(f"a disk the run writes to is full ({first_line(disk)}): free space in its storage_path or "
                          f"the temporary folder, {ROOM}")
            raise out_of_room(p, mlflow_run, room) from None
        why = failure_reason(err)
        store.set_tags(mlflow_run.run_id, {"ropim.failure": why}, p.tracking)
        if type(err).__module__.split(".")[0] != "ray" or hasattr(err, "worker_failures"):
            raise
        raise JobFailed(failed(p, mlflow_run, why)) from err


def unrecorded(p: Prepared, what: str, err: BaseException, held: str = "") -> str:
    """The line of a run whose tracking store did not take ``what`` (a server down past MLflow's own retries);
    ``held``: what the latest checkpoint holds of it."""
    return (f"run {p.cfg.run_name}: the tracking store {p.tracking} did not take {what} ({first_line(err)}); nothing "
            f"registered, the run's complete checkpoints kept{held}; once the store answers, continue with "
            f"`{p.resume_hint}`")


def out_of_room(p: Prepared, mlflow_run: Run, err: NoRoom) -> NoRoom:
    """The line of a run stopped for want of disk room (tagged on the run): where, what it kept, how to continue."""
    cfg = p.cfg
    store.set_tags(mlflow_run.run_id, {"ropim.failure": str(err)}, p.tracking)
    cleaned = f" ({removed})" if (removed := removed_uploads(cfg)) else ""
    return NoRoom(f"run {cfg.run_name}: {err}; its complete checkpoints are kept in {run_dir(cfg)}{cleaned}: then "
                  f"continue with `{p.resume_hint}`")


def removed_uploads(cfg: JobConfig) -> str:
    """Remove the checkpoint uploads of a failed Ray Train run that Ray never registered (``remove_uncommitted``);
    say which ("" when none, or the run was in this process)."""
    removed = remove_uncommitted(run_dir(cfg)) if cfg.num_workers > 0 else []
    return f"removed {len(removed)} checkpoint upload(s) Ray never registered ({', '.join(removed)})" if removed else ""


def failed(p: Prepared, mlflow_run: Run, why: str) -> str:
    """The line of a run that failed outside the job: why, the last epoch MLflow holds and the workers' peak memory
    then, the uploads Ray never registered (removed), how to continue."""
    cfg = p.cfg
    removed = removed_uploads(cfg)
    last = max(store.metric_steps(mlflow_run.run_id, "epoch_time_s", p.tracking), default=0)
    kept = f"epoch {last}/{cfg.epochs} recorded last" if last else "no epoch recorded"
    rss = store.client(p.tracking).get_run(mlflow_run.run_id).data.metrics.get("peak_rss_mb")
    if rss is not None:
        kept += f", workers at {rss / 1024:.1f} GiB peak RSS"
    cleaned = f"; {removed}" if removed else ""
    return (f"run {cfg.run_name} failed: {why}; MLflow run {mlflow_run.run_id} marked FAILED ({kept})"
            f"{cleaned}; continue from its last complete checkpoint with `{p.resume_hint}`")


def cluster_resources() -> tuple[float, float, str]:
    """(CPUs, GPUs, a name) of the Ray cluster this process is connected to."""
    import ray

    total = ray.cluster_resources()
    return total.get("CPU", 0.0), total.get("GPU", 0.0), f"the Ray cluster at {ray.get_runtime_context().gcs_address}"


def pin(p: Prepared) -> Prepared:
    """``p`` with the encoder its job starts from resolved (an alias to its version, a folder made absolute: what every
    worker and a resumed run load) and checked against the job (its config, its weights' depth)."""
    if not isinstance(p.cfg, EncoderJob):
        return p
    ref, _ = resolve_encoder(p.cfg.encoder, p.tracking)
    return dataclasses.replace(p, cfg=p.cfg.pinned(ref.uri, {**ref.config, "depth": ref.depth}, ref.pinned), ref=ref)


def source(p: Prepared) -> str:
    """What the run trains on, for its first line: the data, and the encoder it starts from (or its architecture)."""
    data = dataset_name(p.cfg.data)
    if p.ref is None:
        return data
    start = "random init, architecture of " if getattr(p.cfg, "random_init", False) else ""
    return f"{start}{p.ref.label} on {data}{p.cfg.size(p.ref.config)}"


def tags(p: Prepared) -> dict[str, str]:
    """The run's tags: what it is, the data, and the encoder it started from."""
    if p.ref is None:
        return {"ropim.kind": p.cfg.kind, "ropim.dataset": dataset_name(p.cfg.data)}
    return run_tags(p.ref, p.cfg.kind, p.cfg.data)


def finish(p: Prepared, mlflow_run: Run, result: FitResult, register: bool) -> JobResult:
    """Log the final results of a run whose last epoch is done and register it (unless ``register`` is false; only the
    results when its ``registered_model`` is ""), or mark it stopped; record the outcome."""
    cfg, uri = p.cfg, None
    if result.metrics.get("epoch") == cfg.epochs and result.checkpoint is not None:
        if register:
            with result.checkpoint_dir() as folder:
                if p.job.results:
                    p.job.load("results")(cfg, p.ref, mlflow_run.run_id, folder, p.tracking)
                if cfg.registered_model:  # "" = do not register, for every job
                    with STOP.deferred():  # a version registered is recorded as the run's outcome before a stop
                        uri = registered(p, mlflow_run, result, folder)
                        record(p, mlflow_run, result, uri)
        if not mlflow_run.recorded:
            record(p, mlflow_run, result, uri)
        print(f"[{cfg.kind}] registered {p.job.model} {uri}" if uri else
              f"[{cfg.kind}] finished, nothing registered: {result.checkpoint_path}", flush=True)
    else:
        mlflow_run.stop()
        print(f"[{cfg.kind}] stopped after epoch {result.metrics.get('epoch')}/{cfg.epochs}; continue with "
              f"`{p.resume_hint}`", flush=True)
    return JobResult(mlflow_run.run_id, cfg.run_name, uri, result.checkpoint_path, result.metrics)


def registered(p: Prepared, mlflow_run: Run, result: FitResult, folder: Path) -> str | None:
    """The job's register function on the final checkpoint ``folder``; a registered model found holding another kind
    by then (``MixedKinds``: nothing registered) is one line saying how to register the trained weights it keeps."""
    try:
        uri = p.job.load("register")(p.cfg, p.ref, mlflow_run.run_id, folder, p.tracking)
        scores = p.cfg.version_scores(result.metrics)  # a version's own final scores, for its card
        if uri and scores and (version := registry.resolve_version(uri, p.tracking)):
            registry.tag_scores(*version, scores, p.tracking)
        return uri
    except store.TrackingError as err:
        raise JobFailed(unrecorded(p, f"the {p.job.model}", err)) from None
    except MixedKinds as err:
        raise ConfigError(f"{err.found}, which appeared after the pre-flight (one registered model holds one kind): "
                          f"nothing registered; run {p.cfg.run_name} keeps its trained {p.job.model} "
                          f"({result.checkpoint_path}): register it with `{p.resume_hint} --registered_model "
                          f"{err.suggested}`") from None


def record(p: Prepared, mlflow_run: Run, result: FitResult, uri: str | None) -> None:
    """Record a finished run's outcome: its model's URI as a tag, the stored metadata."""
    if uri:
        store.set_tags(mlflow_run.run_id, {p.job.model_tag: uri}, p.tracking)
    mlflow_run.save(model_uri=uri, checkpoint=result.checkpoint_path, metrics=result.metrics, finished=True)
    mlflow_run.recorded = True


def reported(p: Prepared, mlflow_run: Run) -> JobResult:
    """A run that finished earlier: reported, nothing trained or registered again."""
    cfg = p.cfg
    uri = mlflow_run.tags.get(p.job.model_tag)
    metrics = {**store.client(p.tracking).get_run(mlflow_run.run_id).data.metrics, "epoch": cfg.epochs,
               **mlflow_run.meta.get("metrics", {})}
    print(f"[{cfg.kind}] run {cfg.run_name} already finished (MLflow run {mlflow_run.run_id}); {p.job.model} {uri}",
          flush=True)
    return JobResult(mlflow_run.run_id, cfg.run_name, uri, mlflow_run.meta.get("checkpoint"), metrics, earlier=True)
