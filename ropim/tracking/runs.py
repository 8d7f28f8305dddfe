"""The one run tracker: open (or continue) an MLflow run, and mark it FINISHED, FAILED or KILLED when it ends.

A run with a ``storage_path`` is named: ``<storage_path>/<name>/ropim_run.json`` records its MLflow run id and
config, so that re-running the same name continues the same MLflow run (a different config is refused, except
the fields a caller declares ``resumable``), and a finished run is reported rather than trained again.

    with open_run(experiment="ropim-pretrain", name=..., storage_path=..., config=cfg.to_dict()) as run:
        if run.finished:
            return ...              # nothing to do
        ...                         # an exception marks the run FAILED
        if stopped_early:
            run.stop()              # KILLED: a later job continues it

SIGINT and SIGTERM while the run is open end it KILLED with a line saying how to continue (``resume``), whatever the
job was doing (``ropim.tracking.signals``); a second signal exits at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from mlflow.exceptions import MlflowException

from ropim.errors import ConfigError, first_line
from ropim.tracking.lock import acquire, release
from ropim.tracking.run_meta import RUN_META, read_run_meta, write_run_meta
from ropim.tracking.signals import STOP
from ropim.tracking.store import client, create_run, end_run, log_text, tracking_uri


def changed_fields(stored: dict, wanted: dict, resumable: tuple[str, ...] = (), prefix: str = "") -> list[str]:
    """The fields whose values differ between two configs, dotted inside nested ones (``model.rho``), ignoring the
    ``resumable`` ones (dotted names too: ``pretrain.registered_model``)."""
    changed = []
    for k in sorted(k for k in set(stored) | set(wanted) if prefix + k not in resumable):
        old, new = stored.get(k), wanted.get(k)
        if isinstance(old, dict) and isinstance(new, dict):
            changed += changed_fields(old, new, resumable, f"{prefix}{k}.")
        elif old != new:
            changed.append(prefix + k)
    return changed


@dataclass
class Run:
    """An open MLflow run; as a context manager it marks the run's end status on exit."""

    run_id: str
    name: str
    tracking_uri: str
    storage_path: str | None = None
    continued: bool = False  # an earlier job of this name ran (its MLflow run continues)
    finished: bool = False  # the run had already FINISHED: report it, train nothing
    meta: dict = field(default_factory=dict)
    tags: dict = field(default_factory=dict)  # the MLflow run's tags when it was opened
    outcome: str = "FINISHED"
    lock: str | None = None  # the run folder's lock this job holds (``ropim.tracking.lock``)
    resume: str | None = None  # how to continue the run, printed when a stop signal ends it
    signals: bool = False  # this run installed the stop-signal handlers (``ropim.tracking.signals``)
    recorded: bool = False  # the job recorded its outcome (registered, or marked stopped): a late signal keeps it

    def stop(self) -> None:
        """End this job's part of the run on purpose (KILLED); re-running the same name continues it."""
        self.outcome = "KILLED"

    def save(self, **extra) -> None:
        """Add ``extra`` to the stored metadata (e.g. a sweep's outcome)."""
        self.meta.update(extra)
        if self.storage_path is not None:
            write_run_meta(self.storage_path, self.name, self.meta)

    def __enter__(self) -> Run:
        return self

    def end(self, status: str) -> None:
        """Mark the MLflow run ``status`` as a job ends on an error or a stop, unless the job that owns it ended it
        first (a stopped sweep marks its trials KILLED; a trial failing as the sweep's end takes its workers stays
        KILLED). A store that does not take it (a server down) is said in one line rather than raised over what
        ended the job."""
        try:
            if (ended := client(self.tracking_uri).get_run(self.run_id).info.status) in ("FINISHED", "FAILED",
                                                                                          "KILLED"):
                print(f"[run] {self.name}: MLflow run {self.run_id} was already ended {ended}, kept",
                      file=sys.stderr, flush=True)
                return
            end_run(self.run_id, status, self.tracking_uri)
        except MlflowException as err:
            print(f"[run] {self.name}: MLflow run {self.run_id} not marked {status}, the tracking store did not take "
                  f"it ({first_line(err)})", file=sys.stderr, flush=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        stopped = exc_type is not None and (issubclass(exc_type, KeyboardInterrupt) or STOP.received is not None)
        try:
            if stopped:
                STOP.reported = True
            if stopped and (self.recorded or self.finished):  # the signal came once the outcome was recorded
                if not self.finished:
                    self.end(self.outcome)
                kept = f", registered {self.meta['model_uri']}" if self.meta.get("model_uri") else ""
                print(f"[run] {self.name} stopped by {STOP.name(exc)} once its outcome was recorded: MLflow run "
                      f"{self.run_id} {self.outcome}{kept}", file=sys.stderr, flush=True)
            elif stopped:  # a stop signal, or an error a library made of it
                self.end("KILLED")
                how = f"; continue with: {self.resume}" if self.resume else ""
                print(f"[run] {self.name} stopped by {STOP.name(exc)}: MLflow run {self.run_id} marked "
                      f"KILLED, its complete checkpoints kept, nothing registered{how}", file=sys.stderr, flush=True)
            elif exc_type is not None:
                self.end("FAILED")
            elif not self.finished:
                end_run(self.run_id, self.outcome, self.tracking_uri)
        finally:
            if self.lock is not None:
                release(self.lock)
            if self.signals:
                STOP.restore()


def open_run(*, experiment: str, name: str, config: dict, storage_path: str | None = None, title: str | None = None,
             resumable: tuple[str, ...] = (), tags: dict | None = None, params: dict | None = None,
             config_artifact: str | None = None, uri: str | None = None,
             normalize: Callable[[dict], dict] | None = None, lock: bool = True, resume: str | None = None) -> Run:
    """Open run ``name``: continue the one stored under ``storage_path`` (same config but ``resumable`` fields,
    else ConfigError naming the changed fields), or create a new MLflow run named ``title`` (default ``name``)
    with ``params`` (default: ``config``) flattened, ``tags``, and the config as JSON at ``config_artifact``.
    ``normalize`` brings a stored config to the current form (fields added since get their defaults). A named run
    is locked (``lock``) while it is open: a second job of the same name gets one clear error. From here on, on the
    main thread, SIGINT and SIGTERM end the run KILLED and print ``resume``, the command that continues it."""
    uri = uri or tracking_uri()
    signals = STOP.install()
    held = run = None
    try:
        with STOP.deferred():  # a stop signal while the run opens is raised once it is open, then ends it KILLED
            held = acquire(storage_path, name) if storage_path is not None and lock else None
            run = open_locked(experiment, name, config, storage_path, title, resumable, tags, params,
                              config_artifact, uri, normalize, resume)
            run.lock, run.resume, run.signals = held, resume, signals
    except BaseException as err:
        if run is not None:
            run.__exit__(type(err), err, err.__traceback__)
        else:
            if held is not None:
                release(held)
            if signals:
                STOP.restore()
        raise
    return run


def open_locked(experiment: str, name: str, config: dict, storage_path: str | None, title: str | None,
                resumable: tuple[str, ...], tags: dict | None, params: dict | None, config_artifact: str | None,
                uri: str, normalize: Callable[[dict], dict] | None, resume: str | None = None) -> Run:
    """``open_run`` once the run is locked."""
    meta = read_run_meta(storage_path, name) if storage_path is not None else None
    if meta is None:
        run_id = create_run(experiment, title or name, config if params is None else params, tags, uri)
        if config_artifact:
            log_text(run_id, json.dumps(config, indent=2), config_artifact, uri)
        run = Run(run_id, name, uri, storage_path, meta={"run_id": run_id, "config": config})
        run.save()
        return run
    stored_config = normalize(meta["config"]) if normalize else meta["config"]
    changed = changed_fields(stored_config, config, resumable)
    if changed:
        again = f"continue it as stored with `{resume}`" if resume else \
            f"its stored config is in {storage_path}/{name}/{RUN_META}"
        raise ConfigError(f"a run named {name!r} already exists under {storage_path} with a different config "
                          f"({', '.join(changed)}); {again}, or give this one a new name")
    c = client(uri)
    try:
        stored = c.get_run(meta["run_id"])
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ConfigError(f"run {name!r} under {storage_path} is MLflow run {meta['run_id']}, which the tracking store "
                          f"{uri} does not hold: run the command where the run started, or set MLFLOW_TRACKING_URI "
                          "to the store it was tracked in") from None
    finished = stored.info.status == "FINISHED" or meta.get("finished") is True
    kept = json.loads(json.dumps(meta["config"]))  # what this continuation runs on: what the next --resume reads
    for key in resumable:
        *parents, leaf = key.split(".")
        new, old, node = config, stored_config, kept
        for part in parents:
            new, old, node = new.get(part, {}), old.get(part, {}), node.setdefault(part, {})
        if leaf in new and old.get(leaf) != new[leaf]:
            node[leaf] = new[leaf]
    if kept != meta["config"] and not finished:
        meta = {**meta, "config": kept}
        write_run_meta(storage_path, name, meta)
    if not finished:
        c.update_run(meta["run_id"], status="RUNNING")
    elif stored.info.status != "FINISHED":  # its outcome recorded, then killed before the run was ended: ended now
        end_run(meta["run_id"], "FINISHED", uri)
    return Run(meta["run_id"], name, uri, storage_path, continued=True, finished=finished, meta=meta,
               tags=dict(stored.data.tags))
