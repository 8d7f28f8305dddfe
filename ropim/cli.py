"""The ``ropim`` command: one jsonargparse parser over the typed configs, a subcommand per job.

Every job subcommand takes ``--config FILE`` and ``--preset NAME`` (a YAML shipped in ``ropim/presets/<command>/``,
an ordinary config file), then dotted overrides such as ``--model.rho 0.25``, applied in order (later wins).
Parsing imports only the config modules; torch, Ray and MLflow are imported when a command runs, so ``--help``
and bad input answer at once. Other packages add subcommands through the ``ropim.commands`` entry point group
(``ropim sweep`` comes from ``tune``): an object with ``help``, ``parser()``, ``run(namespace)`` and ``presets()``.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import typing
from argparse import ArgumentError
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, set_parsing_settings

from ropim import commands
from ropim.config_files import check_text, parser_mode
from ropim.console import quiet_console
from ropim.errors import ConfigError, JobFailed
from ropim.tracking.signals import STOP

PRESETS = Path(__file__).with_name("presets")
ERRORS = (ConfigError, JobFailed, LookupError, ConnectionError, FileNotFoundError)


def parser_of(**kwargs) -> ArgumentParser:
    """A parser that raises on bad flags (``main`` prints them as one line) instead of printing its usage, reads
    config files with ``ropim.config_files`` (an empty file is an empty config, a key given twice is refused), and
    shows each config field's docstring as its flag's help."""
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    return ArgumentParser(exit_on_error=False, parser_mode=parser_mode(), **kwargs)


def one_line(err: Exception) -> str:
    """A parser's (possibly multi-line) message as one line."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(line if line.endswith(":") else line + ";" for line in lines).rstrip(";")


def shipped_presets(folder: Path) -> dict[str, Path]:
    """The YAML presets in ``folder``: {name: path}."""
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def preset_action(folders: dict[str, Path]) -> type[ActionConfigFile]:
    """A config-file action whose option strings in ``folders`` take a preset NAME from that folder; the others
    (``--config``) take a file path. Either is applied where it stands among the flags."""

    class ConfigOrPreset(ActionConfigFile):
        def __call__(self, parser, cfg, values, option_string=None):
            folder = folders.get(option_string or "")
            if folder is not None:
                found = shipped_presets(folder)
                if values not in found:
                    known = ", ".join(found) or "none"
                    raise ConfigError(f"unknown {option_string} {values!r}; shipped presets: {known}")
                values = str(found[values])
            else:
                check_text(values)
            super().__call__(parser, cfg, values, option_string)

    return ConfigOrPreset


def job_parser(config_cls: type, command: str, description: str) -> ArgumentParser:
    """A subcommand's parser: ``--config FILE`` / ``--preset NAME``, then every field of ``config_cls``."""
    parser = parser_of(description=description)
    shipped = "`ropim presets`" if shipped_presets(PRESETS / command) else f"none shipped for `ropim {command}` yet"
    parser.add_argument("--config", "--preset", action=preset_action({"--preset": PRESETS / command}),
                        help=f"a YAML config file, or (--preset) a shipped preset name ({shipped}); repeatable, "
                             "applied where it stands")
    parser.add_class_arguments(config_cls, nested_key=None, as_group=False)
    return parser


def source_parser(description: str) -> ArgumentParser:
    """SRC plus the DataConfig fields that say how to read it."""
    from ropim.data.config import DataConfig

    parser = parser_of(description=description)
    parser.add_argument("src", type=str, help="'digits', an ImageFolder / CIFAR folder, Parquet shards, or (--task "
                                              "segment) an ADE20K folder or an images/ + masks/ folder pair")
    defaults = DataConfig()
    parser.add_argument("--task", type=Literal["classify", "segment"], default="classify",
                        help="classify: images with class labels; segment: images with label maps")
    parser.add_argument("--format", type=Literal["auto", "digits", "imagefolder", "cifar", "parquet", "ade20k",
                                                 "pairs"],
                        default=defaults.format, help="source format (default: detect)")
    parser.add_argument("--num-classes", "--num_classes", type=int | None, default=None,
                        help="--task segment: classes of a folder pair without classes.json")
    parser.add_argument("--on-bad-image", "--on_bad_image", type=Literal["skip", "fail"],
                        default=defaults.on_bad_image, help="undecodable images: skip (count, log) or fail")
    parser.add_argument("--val-fraction", "--val_fraction", type=float, default=defaults.val_fraction,
                        help="val share where the source has no split of its own")
    parser.add_argument("--split-seed", "--split_seed", type=int, default=defaults.split_seed)
    parser.add_argument("--follow-links", "--follow_links", type=bool, default=defaults.follow_links,
                        help="ImageFolder / folder pairs: follow symbolic links out of SRC too")
    parser.add_argument("--max-pixels", "--max_pixels", type=int, default=defaults.max_pixels,
                        help="larger images are bad images (a decompression-bomb guard)")
    return parser


def add_data_command(sub) -> None:
    """``ropim data convert SRC DST`` and ``ropim data inspect PATH`` (a parent level is added before its children)."""
    data = parser_of(description="Data sets: `ropim data convert SRC DST`, `ropim data inspect PATH`.")
    sub.add_subcommand("data", data, help="convert a data set to Parquet shards, or inspect one")
    actions = data.add_subcommands(dest="action")
    convert = source_parser("Convert any source to Parquet shards (image, label, path; --task segment: image, "
                            "mask, path) for Ray Data.")
    convert.add_argument("dst", type=str, help="output folder or URI (s3://…)")
    convert.add_argument("--shard-size", "--shard_size", type=int, default=1000, help="images per shard")
    convert.add_argument("--shuffle", type=bool, default=True, help="write items in a seeded random order")
    convert.add_argument("--seed", type=int, default=0, help="seed of that order")
    actions.add_subcommand("convert", convert, help="SRC DST: write Parquet shards, resumable")
    inspect = source_parser("Print a source's format, images per split, classes and image sizes.")
    inspect.add_argument("--sample", type=int, default=200, help="images whose sizes are read")
    actions.add_subcommand("inspect", inspect, help="PATH: format, split sizes, classes, image sizes")


def add_models_command(sub) -> None:
    """``ropim models list [--name N]`` and ``ropim models show URI``."""
    from ropim.tracking.names import DEFAULT_ENCODER_NAME

    models = parser_of(description="The model registry from the terminal.")
    sub.add_subcommand("models", models, help="list registered encoders, or show one's card")
    actions = models.add_subcommands(dest="action")
    listing = parser_of(description="Registered versions: config, scores, aliases.")
    listing.add_argument("--name", type=str, default=DEFAULT_ENCODER_NAME, help="registered model name")
    actions.add_subcommand("list", listing, help="a table of registered versions")
    show = parser_of(description="A version's card: config, scores, lineage, how to load it.")
    show.add_argument("uri", type=str, help="models:/name/version or models:/name@alias")
    actions.add_subcommand("show", show, help="URI: one version's card")


def all_presets(plugin_commands: dict[str, object]) -> dict[str, Path]:
    """Every shipped preset, ropim's and the plugins': {"command/name": path}."""
    listed = {f"{folder.name}/{name}": path for folder in sorted(PRESETS.iterdir()) if folder.is_dir()
              for name, path in shipped_presets(folder).items()}
    for command_name, command in plugin_commands.items():
        listed |= {f"{command_name}/{name}": path for name, path in command.presets().items()}
    return listed


def plugins() -> dict[str, object]:
    """Subcommands other installed packages provide (entry point group ``ropim.commands``)."""
    return {ep.name: ep.load() for ep in entry_points(group="ropim.commands")}


def job_commands() -> dict[str, tuple[type, str, str]]:
    """Each job subcommand: (its config class, its description, its line in ``ropim --help``): the training jobs
    (``ropim.train.jobs``), then the flows and pictures."""
    from ropim.flows.config import DemoConfig, ProbeConfig, TransferConfig
    from ropim.train.jobs import JOBS
    from ropim.viz.config import VizConfig

    return {
        **{name: (job.config, job.description, job.help) for name, job in JOBS.items()},
        "probe": (ProbeConfig, "Linear probe and cosine kNN on frozen features.",
                  "linear probe + kNN top-1 / top-5 of a frozen encoder"),
        "transfer": (TransferConfig, "Fine-tune (or --mode probe) every encoder of --encoders A,B on every source "
                     "of --data D1,D2.", "encoders x data sets table (CSV / Markdown / JSON)"),
        "demo": (DemoConfig, "Pretrain -> register -> fine-tune vs random init (default preset: digits_demo).",
                 "the main job end to end (default: the digits_demo preset)"),
        "viz": (VizConfig, "Reconstruction grid (paper Figs. 3/6/7) from a checkpoint or a registered encoder, and "
                "the token-error histograms of Fig. 5, as PNGs.",
                "write reconstruction / projection grids and Figure-5 histograms as PNGs"),
    }


def add_job_command(sub, name: str, config_cls: type, description: str, help_line: str) -> None:
    """``ropim NAME``: a job subcommand over ``config_cls``."""
    from ropim.train.jobs import JOBS

    parser = job_parser(config_cls, name, description)
    if name in JOBS:
        parser.add_argument("--resume", type=str | None, default=None,
                            help="continue the named run with its stored config; of the flags given beside it, the "
                                 "resumable ones (num_workers, use_gpu, cpus_per_worker, placement_strategy, "
                                 "min_workers, max_failures, stop_after_epochs, …) change it, any other is refused")
    if name == "demo":
        parser.default_config_files = [str(PRESETS / "demo" / "digits_demo.yaml")]
    sub.add_subcommand(name, parser, help=help_line)


def build_parser(only: str | None = None) -> tuple[ArgumentParser, dict[str, object]]:
    """The ``ropim`` parser with its subcommands, and the plugin commands it holds. ``only``: when it names a
    subcommand, that one alone (all a command line that starts with it needs; building all takes longer than most
    bad-input answers)."""
    parser = parser_of(prog="ropim", description="ROPIM pretraining, sweeps and fine-tuning on Ray + MLflow.")
    sub = parser.add_subcommands(dest="command")
    jobs, found = job_commands(), plugins()
    names = [*jobs, "presets", "data", "models", *found]
    for name in [only] if only in names else names:
        if name in jobs:
            add_job_command(sub, name, *jobs[name])
        elif name == "presets":
            sub.add_subcommand("presets", parser_of(description="List shipped presets."), help="list shipped presets")
        elif name == "data":
            add_data_command(sub)
        elif name == "models":
            add_models_command(sub)
        else:
            sub.add_subcommand(name, found[name].parser(), help=found[name].help)
    return parser, found


def typed_fields(parser: ArgumentParser, argv: list[str], command: str | None = None) -> frozenset[str]:
    """The dotted names of the fields ``argv`` gives (``command``: that subcommand): its flags and the config files
    it names, whatever their values (a value equal to the default is given all the same), without the defaults."""
    given = parser.parse_args(argv, defaults=False)
    return frozenset(k for k, _ in (given[command] if command else given).items() if k not in ("config", "resume"))


def check_sections(ns: Namespace, cls: type, prefix: str = "") -> None:
    """ConfigError for a nested config (``data``, ``model``, ``finetune``, …) that a config file gave as no mapping: an
    empty ``data:`` section (its keys all commented out) or a plain value, which jsonargparse cannot build."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            value = ns.get(f.name)
            if not isinstance(value, Namespace):
                first = dataclasses.fields(hints[f.name])[0].name
                raise ConfigError(f"{prefix}{f.name}: {value!r} is not a mapping of its settings (an empty "
                                  f"'{f.name}:' section, or a value); give its keys below it (e.g. '  {first}: …') "
                                  "or drop the line")
            check_sections(value, hints[f.name], f"{prefix}{f.name}.")


def main(argv: list[str] | None = None, quiet: bool | None = None) -> None:
    """Entry point of the ``ropim`` console script: one line, never a traceback, for bad input. ``quiet`` (default:
    when run as a program, i.e. without ``argv``) filters library chatter from the console (``quiet_console``)."""
    program = argv is None if quiet is None else quiet  # the process is this command (console script, jobs/*.py)
    if program:
        quiet_console()
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "ropim")
    installed = STOP.install()  # a stop signal from the first line on ends the command in one line
    try:
        parser, plugin_commands = build_parser(command)
        args = parser.parse_args(argv)
        if args.command in ("data", "models") and args[args.command].action:
            command = f"{args.command} {args[args.command].action}"
        if args.command == "presets":
            commands.run_presets(all_presets(plugin_commands))
            return
        if args.command in (jobs := job_commands()):
            check_sections(args[args.command], jobs[args.command][0])
        ns = args[args.command] if args.command in ("data", "models") else parser.instantiate(args)[args.command]
        if args.command in plugin_commands:  # a plugin's run(ns, typed): typed as for the jobs' --resume
            plugin_commands[args.command].run(ns, typed_fields(parser, argv, args.command))
        elif ns.get("resume"):  # the stored run, changed only where this command line says so
            commands.run_job(args.command, ns, typed_fields(parser, argv, args.command))
        else:
            commands.runner(args.command)(ns)
        if program and installed:
            STOP.finished()  # recorded and printed: a stop signal now only cuts the interpreter's teardown short
    except KeyboardInterrupt as err:  # a stop signal: an open run said how it ended (``ropim.tracking.signals``)
        raise SystemExit(stopped(command, err)) from None
    except Exception as err:
        if STOP.received is not None:  # a library made the stop signal into another error
            raise SystemExit(stopped(command, err)) from None
        if isinstance(err, ERRORS):
            raise SystemExit(f"ropim {command}: {err}") from None
        if isinstance(err, ArgumentError):
            where = "ropim" if "invalid choice" in str(err) else f"ropim {command}"
            raise SystemExit(f"ropim {command}: {one_line(err)} (see `{where} --help`)") from None
        raise
    finally:
        if installed and not STOP.done:
            STOP.restore()


def stopped(command: str, err: BaseException) -> int:
    """The exit status of a command ended by a stop signal: 128 + its number (130 for Ctrl+C, 143 for SIGTERM), after
    one line when no run was open to say how it ended."""
    if not STOP.reported:
        print(f"ropim {command}: stopped by {STOP.name(err)} while no run was open; nothing recorded",
              file=sys.stderr, flush=True)
    return 128 + signal.Signals[STOP.name(err)]


if __name__ == "__main__":
    main()
