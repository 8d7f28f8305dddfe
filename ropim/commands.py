"""What each ``ropim`` subcommand runs, given its parsed flags. Configs are validated, the tracking store reached,
encoder URIs checked and the training split counted before torch, Ray or MLflow-heavy modules are imported, so bad
input fails in a fraction of a second."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from jsonargparse import Namespace

from ropim.checks import check_encoder_input
from ropim.errors import ConfigError


def config(ns: Namespace, cls: type):
    """Build ``cls`` from a subcommand namespace (the config-file and extra flags dropped)."""
    from dataclasses import fields

    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in ns.items() if k in names})


def run_presets(listed: dict[str, object]) -> None:
    """``ropim presets``: every shipped preset ({"command/name": path}) with the first line of its file."""
    for name, path in listed.items():
        print(f"{name:<28} {path.read_text().splitlines()[0].lstrip('# ')}")


def run_data(ns: Namespace) -> None:
    """``ropim data convert|inspect``."""
    from ropim.data.config import DataConfig

    if ns.action is None:
        raise ConfigError("ropim data: choose convert or inspect (see `ropim data --help`)")
    args = ns[ns.action]
    cfg = DataConfig(source=args.src, format=args.format, val_fraction=args.val_fraction,
                     split_seed=args.split_seed, on_bad_image=args.on_bad_image, follow_links=args.follow_links,
                     max_pixels=args.max_pixels)
    if args.task == "segment":
        from ropim.data.config import SegDataConfig

        cfg = SegDataConfig(**vars(cfg), num_classes=args.num_classes)
    if ns.action == "convert":
        from ropim.data.convert import convert
        from ropim.tracking.signals import STOP

        try:
            rep = convert(cfg, args.dst, args.shard_size, shuffle=args.shuffle, seed=args.seed)
        except KeyboardInterrupt as err:  # a stop signal: what convert wrote is whole and kept (``ropim.cli.stopped``)
            print(f"ropim data convert: stopped by {STOP.name(err)}; the shards written so far are kept, and the "
                  "same command writes the rest", file=sys.stderr, flush=True)
            STOP.reported = True
            raise
        images = "  ".join(f"{s} {n:,}" for s, n in rep.images.items())
        noun = "pairs" if args.task == "segment" else "images"
        print(f"{rep.dst}: {images} {noun}; shards written {rep.shards_written}, kept {rep.shards_kept}; "
              f"bad {noun} skipped {rep.bad_images}")
    elif args.task == "segment":
        from ropim.data.inspect import pairs_summary

        print(pairs_summary(cfg))
    else:
        from ropim.data.inspect import format_summary, inspect_source

        print(format_summary(inspect_source(cfg, args.sample)))


def preflight(cfg, encoders: list[str] = (), check_encoder: Callable[[str, dict], None] | None = None):
    """Validate ``cfg`` (a flow's: probe, transfer), reach the tracking store and check that ``encoders``
    exist, before torch or Ray is imported; ``check_encoder(uri, config)`` then reads the config of each one that is a
    local folder. Return ``cfg``. (A training job's pre-flight is its ``prepare``, the demo's ``prepare_demo``.)"""
    from ropim.tracking.preflight import check_models
    from ropim.tracking.uri import check_tracking, tracking_uri

    cfg.validate()
    cfg.check_resources()
    tracking = tracking_uri()
    check_tracking(tracking)
    check_models(list(encoders), "encoder", tracking, check_encoder)
    return cfg


def run_models(ns: Namespace) -> None:
    """``ropim models list|show``."""
    from ropim.tracking.uri import check_model_in_store, check_tracking, missing_sqlite_file, tracking_uri

    if ns.action is None:
        raise ConfigError("ropim models: choose list or show (see `ropim models --help`)")
    check_tracking(tracking_uri())
    args = ns[ns.action]
    if ns.action == "show":
        check_model_in_store(args.uri, "encoder", tracking_uri())  # before MLflow is imported
    elif missing_sqlite_file(tracking_uri()):  # looking would create an empty store here
        raise ConfigError(f"no tracking store at {tracking_uri()}: nothing is registered here; run where your runs "
                          "are (the folder holding mlflow.db) or set MLFLOW_TRACKING_URI to their store")
    from ropim.tracking import catalog

    print(catalog.list_versions(args.name) if ns.action == "list" else catalog.show(args.uri))


def run_job(name: str, ns: Namespace, typed: frozenset[str] = frozenset()) -> None:
    """``ropim NAME`` for a training job (``ropim.train.jobs``): everything checked (``prepare``) before torch or Ray
    is imported, then the job; its last line is its URI or scores, or how to continue it. ``--resume RUN`` runs the
    stored config of RUN, changed only where the command line typed a resumable field (``typed``: the dotted names of
    the fields it gives)."""
    from ropim.data.sources import one_listing
    from ropim.train.jobs import JOBS, prepare, resumed

    job = JOBS[name]
    cfg = config(ns, job.config)
    if ns.resume:
        cfg, changes = resumed(job, ns.resume, cfg, set(typed))
        if changes:
            print(f"[{name}] --resume {ns.resume}: " + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new)
                                                               in changes.items()) + " (typed); the rest as stored",
                  flush=True)
    with one_listing():  # the pre-flight lists the data once; the job's datasets take that listing
        prepared = prepare(cfg)
        from ropim.train.driver import run

        result = run(prepared)
    if result.metrics.get("epoch") != prepared.cfg.epochs:
        print(f"unfinished: {prepared.resume_hint}")
    else:
        kept = result.model_uri or f"not registered: {result.checkpoint_path}"  # registered, or its checkpoint
        print(job.scores.format(**result.metrics, model_uri=kept, run_id=result.run_id) if job.scores
              else result.model_uri or result.checkpoint_path)


def run_probe(ns: Namespace) -> None:
    from ropim.data.sources import check_decodes
    from ropim.flows.config import ProbeConfig

    cfg = config(ns, ProbeConfig)
    preflight(cfg, [cfg.encoder], lambda uri, encoder: check_encoder_input(uri, encoder, cfg.img_size))
    check_decodes(cfg.data)
    from ropim.flows.probe import probe

    r = probe(cfg)
    print(f"linear top-1 {r['linear']['top1']:.2f}% top-5 {r['linear']['top5']:.2f}%  "
          f"kNN top-1 {r['knn']['top1']:.2f}% top-5 {r['knn']['top5']:.2f}%  (MLflow run {r['run_id']})")


def run_transfer(ns: Namespace) -> None:
    from ropim.flows.config import TransferConfig

    cfg = config(ns, TransferConfig)
    preflight(cfg, cfg.encoder_list)
    from ropim.flows.transfer import transfer

    transfer(cfg)


def run_demo(ns: Namespace) -> None:
    from ropim.flows.config import DemoConfig, prepare_demo

    cfg, pretrain = prepare_demo(config(ns, DemoConfig))
    from ropim.flows.demo import run_demo as demo

    demo(cfg, pretrain)


def run_viz(ns: Namespace) -> None:
    from ropim.viz.config import VizConfig

    cfg = config(ns, VizConfig).validate()
    from ropim.viz.command import describe
    from ropim.viz.command import run_viz as viz

    print(describe(viz(cfg)))


RUNNERS: dict[str, Callable[[Namespace], None]] = {
    "probe": run_probe, "transfer": run_transfer, "demo": run_demo, "viz": run_viz, "data": run_data,
    "models": run_models,
}


def runner(command: str) -> Callable[[Namespace], None]:
    """What ``ropim COMMAND`` runs: a training job's ``run_job``, or the command's own."""
    return RUNNERS.get(command) or functools.partial(run_job, command)
