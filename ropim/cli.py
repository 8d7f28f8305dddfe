"""The ``ropim`` command: subcommands over the library, configs from YAML files, presets and flags.

Every subcommand takes ``--config FILE`` and ``--preset NAME`` (a YAML shipped in
``ropim/presets/<command>/``), then dotted overrides such as ``--model.rho 0.25``; later wins.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from jsonargparse import ActionConfigFile, ArgumentParser

from ropim.errors import ConfigError

PRESETS = Path(__file__).with_name("presets")


def presets(command: str | None = None) -> dict[str, Path]:
    """Shipped presets as {'command/name': path}."""
    return {f"{p.parent.name}/{p.stem}": p for p in sorted(PRESETS.glob(f"{command or '*'}/*.yaml"))}


def _expand_presets(command: str, argv: list[str]) -> list[str]:
    """Turn ``--preset NAME`` into ``--config <shipped file>`` so it composes with other flags in order."""
    out, it = [], iter(argv)
    for arg in it:
        if arg == "--preset":
            name = next(it, "")
        elif arg.startswith("--preset="):
            name = arg.removeprefix("--preset=")
        else:
            out.append(arg)
            continue
        path = presets(command).get(f"{command}/{name}")
        if path is None:
            known = ", ".join(k.split("/", 1)[1] for k in presets(command)) or "none"
            raise SystemExit(f"ropim {command}: unknown --preset {name!r}; shipped presets: {known}")
        out += ["--config", str(path)]
    return out


def _data_shorthand(argv: list[str]) -> list[str]:
    """``--data SOURCE`` (not a YAML file or mapping) means ``--data.source SOURCE``."""
    out, i = [], 0
    while i < len(argv):
        arg, value = argv[i], None
        if arg == "--data" and i + 1 < len(argv):
            value, i = argv[i + 1], i + 1
        elif arg.startswith("--data="):
            value = arg.removeprefix("--data=")
        if value is None or value.lstrip().startswith("{") or value.endswith((".yaml", ".yml", ".json")):
            out += [arg] if value is None else ["--data", value]
        else:
            out += ["--data.source", value]
        i += 1
    return out


def _sub(config_cls, description: str) -> ArgumentParser:
    parser = ArgumentParser(description=description)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML config file (repeatable; later wins)")
    parser.add_argument("--preset", type=str, help="a shipped preset (`ropim presets`), applied where it stands")
    parser.add_class_arguments(config_cls, nested_key=None, as_group=False)
    return parser


def build_parser() -> ArgumentParser:
    """The ``ropim`` parser with its subcommands."""
    from ropim.finetune import FinetuneConfig
    from ropim.pipeline import DemoConfig
    from ropim.probe import ProbeConfig
    from ropim.train import PretrainConfig
    from ropim.transfer import TransferConfig
    from ropim.viz import VizConfig

    parser = ArgumentParser(prog="ropim", description="ROPIM pretraining, sweeps and fine-tuning on Ray + MLflow.")
    sub = parser.add_subcommands(dest="command")
    pretrain = _sub(PretrainConfig, "Pretrain a ViT with ROPIM on Ray Train; register it.")
    pretrain.add_argument("--resume", type=str, help="continue the named run with its stored config "
                          "(num_workers, use_gpu, stop_after_epochs, max_failures may change)")
    sub.add_subcommand("pretrain", pretrain, help="pretrain an encoder and register it in MLflow")
    sub.add_subcommand("finetune", _sub(FinetuneConfig, "Fine-tune a classifier from an encoder (models:/name/"
                                        "version, models:/name@alias, runs:/…, or a local folder) on Ray Train "
                                        "(num_workers=0: in this process); register it as ropim-classifier."),
                       help="fine-tune from an encoder URI and report top-1 / top-5")
    sub.add_subcommand("probe", _sub(ProbeConfig, "Linear probe and cosine kNN on frozen features of an encoder."),
                       help="linear probe + kNN top-1 / top-5 of a frozen encoder")
    sub.add_subcommand("transfer", _sub(TransferConfig, "Fine-tune (or --mode probe) every encoder of --encoders "
                                        "A,B on every source of --data D1,D2; print and save the table."),
                       help="encoders x data sets table (CSV / Markdown / JSON)")
    sub.add_subcommand("demo", _sub(DemoConfig, "Pretrain -> register -> fine-tune vs random init."),
                       help="the main job end to end (default: the digits_demo preset)")
    sub.add_subcommand("viz", _sub(VizConfig, "Reconstruction grid (paper Figs. 3/6/7) from a checkpoint or a "
                                   "registered encoder, and the token-error histograms of Fig. 5, as PNGs."),
                       help="write reconstruction / projection grids and Figure-5 histograms as PNGs")
    sub.add_subcommand("presets", ArgumentParser(description="List shipped presets."), help="list shipped presets")
    sub.add_subcommand("sweep", ArgumentParser(description="Ray Tune + Optuna sweeps; see `ropim sweep --help`."),
                       help="sweep rho / lr / epochs on Ray Tune (+ Optuna); register the best encoder")
    data = ArgumentParser(description="Data sets: `ropim data convert SRC DST`, `ropim data inspect PATH`.")
    sub.add_subcommand("data", data, help="convert a data set to Parquet shards, or inspect one")
    data_sub = data.add_subcommands(dest="action")
    convert = _source_parser("Convert any source to Parquet shards (image, label, path) for Ray Data.")
    convert.add_argument("dst", type=str, help="output folder or URI (s3://…)")
    convert.add_argument("--shard-size", "--shard_size", type=int, default=1000, help="images per shard")
    convert.add_argument("--shuffle", type=bool, default=True, help="write items in a seeded random order")
    convert.add_argument("--seed", type=int, default=0, help="seed of that order")
    data_sub.add_subcommand("convert", convert, help="SRC DST: write Parquet shards, resumable")
    inspect = _source_parser("Print a source's format, images per split, classes and image sizes.")
    inspect.add_argument("--sample", type=int, default=200, help="images whose sizes are read")
    data_sub.add_subcommand("inspect", inspect, help="PATH: format, split sizes, classes, image sizes")
    return parser


def _source_parser(description: str) -> ArgumentParser:
    """SRC plus the DataConfig fields that say how to read it."""
    from ropim.data import DataConfig

    parser = ArgumentParser(description=description)
    parser.add_argument("src", type=str, help="'digits', an ImageFolder / CIFAR folder, or Parquet shards")
    defaults = DataConfig()
    parser.add_argument("--format", type=Literal["auto", "digits", "imagefolder", "cifar", "parquet"],
                        default=defaults.format, help="source format (default: detect)")
    parser.add_argument("--on-bad-image", "--on_bad_image", type=Literal["skip", "fail"],
                        default=defaults.on_bad_image, help="undecodable images: skip (count, log) or fail")
    parser.add_argument("--val-fraction", "--val_fraction", type=float, default=defaults.val_fraction,
                        help="val share where the source has no split of its own")
    parser.add_argument("--split-seed", "--split_seed", type=int, default=defaults.split_seed)
    return parser


def _run_data(ns) -> None:
    """``ropim data convert|inspect``."""
    from ropim.data import DataConfig

    action = ns.action
    if action is None:
        raise SystemExit("ropim data: choose convert or inspect (see `ropim data --help`)")
    args = ns[action]
    cfg = DataConfig(source=args.src, format=args.format, val_fraction=args.val_fraction,
                     split_seed=args.split_seed, on_bad_image=args.on_bad_image)
    try:
        if action == "convert":
            from ropim.convert import convert

            rep = convert(cfg, args.dst, args.shard_size, shuffle=args.shuffle, seed=args.seed)
            images = "  ".join(f"{s} {n:,}" for s, n in rep.images.items())
            print(f"{rep.dst}: {images} images; shards written {rep.shards_written}, kept {rep.shards_kept}; "
                  f"bad images skipped {rep.bad_images}")
        else:
            from ropim.summary import format_summary, inspect_source

            print(format_summary(inspect_source(cfg, args.sample)))
    except (ConfigError, FileNotFoundError, OSError) as err:
        raise SystemExit(f"ropim data {action}: {err}") from None


def _config(ns, cls):
    """Build ``cls`` from a subcommand namespace (dropping --config/--preset)."""
    values = {k: v for k, v in ns.items() if k not in ("config", "preset", "resume", "__path__")}
    return cls(**values)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``ropim`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "sweep":  # tune parses its own flags; its presets live in tune/, not ropim/presets
        from tune.sweep import main as sweep_main

        sweep_main(argv[argv.index("sweep") + 1:])
        return
    if command == "demo" and not any(a.startswith(("--preset", "--config")) for a in argv):
        argv.insert(argv.index("demo") + 1, "--preset=digits_demo")
    if command:
        argv = _expand_presets(command, argv)
    if command in ("finetune", "probe"):
        argv = _data_shorthand(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "presets":
        for name, path in presets().items():
            head = path.read_text().splitlines()[0].lstrip("# ")
            print(f"{name:<28} {head}")
        return
    if args.command == "data":
        _run_data(args.data)
        return
    ns = parser.instantiate(args)[args.command]
    try:
        if args.command == "pretrain":
            from ropim.train import RESUMABLE, PretrainConfig, pretrain, resume_config

            cfg = _config(ns, PretrainConfig)
            if ns.resume:
                cfg = resume_config(ns.resume, cfg.storage_path, **{k: getattr(cfg, k) for k in RESUMABLE})
            result = pretrain(cfg)
            print(result.encoder_uri or f"unfinished: ropim pretrain --resume {cfg.run_name}")
        elif args.command == "finetune":
            from ropim.finetune import FinetuneConfig, finetune

            metrics = finetune(_config(ns, FinetuneConfig))
            if "top1" in metrics:
                print(f"top-1 {metrics['top1']:.2f}%  top-5 {metrics['top5']:.2f}%  classifier "
                      f"{metrics.get('classifier_uri')}  (MLflow run {metrics['run_id']})")
        elif args.command == "probe":
            from ropim.probe import ProbeConfig, probe

            r = probe(_config(ns, ProbeConfig))
            print(f"linear top-1 {r['linear']['top1']:.2f}% top-5 {r['linear']['top5']:.2f}%  "
                  f"kNN top-1 {r['knn']['top1']:.2f}% top-5 {r['knn']['top5']:.2f}%  (MLflow run {r['run_id']})")
        elif args.command == "transfer":
            from ropim.transfer import TransferConfig, transfer

            transfer(_config(ns, TransferConfig))
        elif args.command == "demo":
            from ropim.pipeline import DemoConfig, run_demo

            run_demo(_config(ns, DemoConfig))
        elif args.command == "viz":
            from ropim.viz import VizConfig, describe, run_viz

            print(describe(run_viz(_config(ns, VizConfig))))
    except (ConfigError, LookupError, ConnectionError, FileNotFoundError) as err:
        raise SystemExit(f"ropim {args.command}: {err}") from None


if __name__ == "__main__":
    main()
