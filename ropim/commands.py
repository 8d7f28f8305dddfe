"""What each ``ropim`` subcommand runs, given its parsed flags. Configs are validated, the tracking store reached,
encoder URIs checked and the training split counted before torch, Ray or MLflow-heavy modules are imported, so bad
input fails in a fraction of a second."""

from __future__ import annotations

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
                     split_seed=args.split_seed, on_bad_image=args.on_bad_image)
    if args.task == "segment":
        from ropim.data.seg_config import SegDataConfig

        cfg = SegDataConfig(**vars(cfg), num_classes=args.num_classes)
    if ns.action == "convert":
        if args.task == "segment":
            from ropim.data.seg_convert import convert_segments as convert
        else:
            from ropim.data.convert import convert

        rep = convert(cfg, args.dst, args.shard_size, shuffle=args.shuffle, seed=args.seed)
        images = "  ".join(f"{s} {n:,}" for s, n in rep.images.items())
        print(f"{rep.dst}: {images} images; shards written {rep.shards_written}, kept {rep.shards_kept}; "
              f"bad images skipped {rep.bad_images}")
    elif args.task == "segment":
        from ropim.data.seg_sources import check_seg_source, open_seg_source

        src = check_seg_source(cfg.validate()) or open_seg_source(cfg)
        pairs = "  ".join(f"{s} {len(p):,}" for s, p in src.splits.items())
        print(f"{src.location}: format {src.format}; pairs: {pairs}; {len(src.classes)} classes "
              f"({', '.join(src.classes[:8])}{', …' if len(src.classes) > 8 else ''})")
    else:
        from ropim.data.inspect import format_summary, inspect_source

        print(format_summary(inspect_source(cfg, args.sample)))


def preflight(cfg, encoders: list[str] = (), check_encoder: Callable[[str, dict], None] | None = None):
    """Validate ``cfg``, reach the tracking store and check that ``encoders`` exist, before torch or Ray is
    imported; ``check_encoder(uri, config)`` then reads the config of each one that is a local folder. Return
    ``cfg``."""
    import json

    from ropim.tracking.model_folder import check_local_model
    from ropim.tracking.uri import check_model_in_store, check_tracking, tracking_uri

    cfg.validate()
    cfg.check_resources()
    tracking = tracking_uri()
    check_tracking(tracking)
    registered = []
    for uri in encoders:
        folder = check_local_model(uri, "encoder")  # a folder: its files read here, without MLflow or torch
        if folder is None:
            check_model_in_store(uri, "encoder", tracking)
            registered.append(uri)
        elif folder.is_dir() and check_encoder is not None:  # its config.json, found whole just above
            check_encoder(uri, json.loads(next(folder.rglob("config.json")).read_text()))
    if registered:
        from ropim.tracking.registry import check_model_uri

        for uri in registered:
            check_model_uri(uri)
    return cfg


def run_models(ns: Namespace) -> None:
    """``ropim models list|show``."""
    from ropim.tracking.uri import check_model_in_store, check_tracking, tracking_uri

    if ns.action is None:
        raise ConfigError("ropim models: choose list or show (see `ropim models --help`)")
    check_tracking(tracking_uri())
    args = ns[ns.action]
    if ns.action == "show":
        check_model_in_store(args.uri, "encoder", tracking_uri())  # before MLflow is imported
    from ropim.tracking import catalog

    print(catalog.list_versions(args.name) if ns.action == "list" else catalog.show(args.uri))


def run_pretrain(ns: Namespace) -> None:
    from ropim.data.sources import check_batch_fits
    from ropim.train.config import PretrainConfig

    cfg = config(ns, PretrainConfig)
    if ns.resume:
        from ropim.train.pretrain import resume_config

        cfg = resume_config(ns.resume, cfg.storage_path, **{k: getattr(cfg, k) for k in PretrainConfig.RESUMABLE})
    preflight(cfg)
    check_batch_fits(cfg.data, {"global_batch_size": cfg.global_batch_size})
    from ropim.train.pretrain import pretrain

    result = pretrain(cfg)
    print(result.encoder_uri or f"unfinished: ropim pretrain --resume {cfg.run_name}")


def run_finetune(ns: Namespace) -> None:
    from ropim.data.sources import check_batch_fits
    from ropim.train.config import FinetuneConfig

    cfg = config(ns, FinetuneConfig)
    preflight(cfg, [cfg.encoder], lambda uri, encoder: check_encoder_input(uri, encoder, cfg.img_size))
    check_batch_fits(cfg.data, {"batch_size": cfg.batch_size})
    from ropim.train.finetune import finetune

    metrics = finetune(cfg)
    if "top1" in metrics:
        print(f"top-1 {metrics['top1']:.2f}%  top-5 {metrics['top5']:.2f}%  classifier "
              f"{metrics.get('classifier_uri')}  (MLflow run {metrics['run_id']})")


def run_graft(ns: Namespace) -> None:
    from ropim.data.sources import check_batch_fits
    from ropim.train.graft_config import GraftConfig

    cfg = config(ns, GraftConfig).resolved()
    preflight(cfg, [cfg.encoder], cfg.check_encoder)
    check_batch_fits(cfg.data, {"global_batch_size": cfg.global_batch_size})
    from ropim.train.graft import graft

    result = graft(cfg)
    print(result.encoder_uri or f"unfinished: re-run with --run_name {result.run_name}")


def run_segment(ns: Namespace) -> None:
    from ropim.train.segment_config import SegmentConfig

    cfg = config(ns, SegmentConfig).resolved()
    preflight(cfg, [cfg.encoder], cfg.check_encoder)  # random init too: the encoder gives the architecture
    from ropim.train.segment_job import segment

    metrics = segment(cfg)
    if "miou" in metrics:
        print(f"mIoU {metrics['miou']:.2f}%  pixel accuracy {metrics['pixel_acc']:.2f}%  segmenter "
              f"{metrics.get('segmenter_uri')}  (MLflow run {metrics['run_id']})")


def run_probe(ns: Namespace) -> None:
    from ropim.flows.config import ProbeConfig

    cfg = config(ns, ProbeConfig)
    preflight(cfg, [cfg.encoder], lambda uri, encoder: check_encoder_input(uri, encoder, cfg.img_size))
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
    from ropim.flows.config import DemoConfig

    cfg = preflight(config(ns, DemoConfig))
    from ropim.flows.demo import run_demo as demo

    demo(cfg)


def run_viz(ns: Namespace) -> None:
    from ropim.viz.config import VizConfig

    cfg = config(ns, VizConfig).validate()
    from ropim.viz.command import describe
    from ropim.viz.command import run_viz as viz

    print(describe(viz(cfg)))


RUNNERS: dict[str, Callable[[Namespace], None]] = {
    "pretrain": run_pretrain, "finetune": run_finetune, "graft": run_graft, "segment": run_segment, "probe": run_probe,
    "transfer": run_transfer, "demo": run_demo, "viz": run_viz, "data": run_data, "models": run_models,
}
