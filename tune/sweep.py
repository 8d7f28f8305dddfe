"""``ropim sweep`` (also ``python -m tune.sweep`` and ``jobs/sweep.py``): the sweep's command line.

    ropim sweep --preset rho_ablation --workers-per-trial 1 --epochs 4
    ropim sweep --preset tpe --num-samples 12 --max-concurrent 2 --model.depth 4

One jsonargparse parser: ``--preset NAME`` (``tune/presets/``) / ``--config FILE`` for the sweep,
``--pretrain-preset NAME`` / ``--pretrain-config FILE`` for the pretraining run every trial starts from (default
preset: rho_ablation on digits_demo), the sweep's own flags, and every ``ropim pretrain`` flag, applied in order.
``--resume NAME`` continues the sweep NAME with its stored config; of the flags given beside it, those of
``RESUMABLE`` change it and any other whose value differs from the stored one is refused (as a job's ``--resume``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from argparse import ArgumentError, ArgumentTypeError
from dataclasses import asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from jsonargparse import ArgumentParser, Namespace

from ropim.cli import ERRORS, one_line, parser_of, preset_action, shipped_presets, stopped, typed_fields
from ropim.cli import PRESETS as ROPIM_PRESETS
from ropim.console import quiet_console
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.jobs import field_value
from ropim.train.pretrain.config import PretrainConfig
from ropim.train.segment.config import SegmentConfig
from tune.config import FINETUNE_FROM_TRIAL, METRICS, PRESETS, SCHEDULERS, SEARCHES, SweepConfig
from tune.preflight import derived, prepare

if TYPE_CHECKING:
    from tune.outcome import SweepResult

# PretrainConfig fields the sweep sets itself (per trial, or as the sweep's own flag of the same name)
NOT_PRETRAIN_FLAGS = {"storage_path", "experiment", "run_name", "num_workers", "cpus_per_worker"}
HELP = "sweep rho / lr / epochs on Ray Tune (+ Optuna); register the best encoder"
# what may change when a sweep is continued: whether and as what its best encoder is registered (a registered model
# found holding classifiers at the end of a sweep, say); the trials already run fix everything else
RESUMABLE = ("register", "registered_model")
SPACE_EXAMPLE = """'{"rho": {"grid": [0.14, 0.25]}}'"""  # what --space's errors show, quoted for the shell


class SpaceJson:
    """``--space``'s type: JSON text (YAML flow style too) parsed into a mapping of knobs, a config file's mapping
    kept; anything else is refused in one line (argparse prefixes ``argument --space:``) with what it should be."""

    def __repr__(self) -> str:  # the type --help shows
        return "JSON object"

    def __call__(self, value: object) -> dict | None:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                try:
                    value = yaml.safe_load(value)
                except yaml.YAMLError:
                    value = None
                if not isinstance(value, dict):
                    raise ArgumentTypeError(f"not valid JSON ({err}); e.g. {SPACE_EXAMPLE}") from None
        if value is not None and not isinstance(value, dict):
            raise ArgumentTypeError(f"{value!r} is not a JSON object of knobs; e.g. {SPACE_EXAMPLE}")
        return value


def parser() -> ArgumentParser:
    """The sweep's parser: sweep flags and every pretraining flag."""
    lines = "\n".join(f"  {name:<14} {path.read_text().splitlines()[0].lstrip('# ')}"
                      for name, path in shipped_presets(PRESETS).items())
    p = parser_of(prog="ropim sweep", default_config_files=[str(PRESETS / "rho_ablation.yaml")],
                       description="Sweep ROPIM pretraining with Ray Tune (+ Optuna); each trial is a Ray Train run.",
                       epilog=f"sweep presets:\n{lines}")
    action = preset_action({"--preset": PRESETS, "--pretrain-preset": ROPIM_PRESETS / "pretrain"})
    p.add_argument("--config", "--preset", "--pretrain-config", "--pretrain-preset", action=action,
                   help="sweep (--preset NAME, --config FILE) or pretraining (--pretrain-preset NAME, "
                        "--pretrain-config FILE) settings; default preset rho_ablation; applied where they stand")
    p.add_argument("--resume", type=str | None, default=None,
                   help="continue the sweep NAME (under --storage-path) with its stored config; of the flags given "
                        f"beside it, {' and '.join('--' + k for k in RESUMABLE)} change it, any other is refused")
    p.add_argument("--preset_name", "--preset-name", type=str, default="rho_ablation",
                   help="the preset's name, recorded with the sweep (set by the preset files)")
    p.add_argument("--search", type=Literal[SEARCHES], default="grid", help="grid, or tpe (Optuna)")
    p.add_argument("--space", type=SpaceJson(), default=None,
                   help='search space as JSON, e.g. \'{"rho": {"grid": [0.1, 0.3]}}\' (kinds grid, choice, uniform, '
                        "loguniform over any pretraining field)")
    p.add_argument("--metric", type=Literal[tuple(METRICS)], default="knn_top1", help="the objective on the val split")
    p.add_argument("--scheduler", type=Literal[SCHEDULERS], default="none", help="none, or asha (early stopping)")
    p.add_argument("--grace_period", "--grace-period", type=int, default=1, help="ASHA: epochs before a stop")
    p.add_argument("--reduction_factor", "--reduction-factor", type=int, default=2, help="ASHA")
    p.add_argument("--num_samples", "--num-samples", type=int, default=1,
                   help="TPE: trials; grid: seeds per grid point")
    p.add_argument("--max_concurrent", "--max-concurrent", type=int | None, default=None,
                   help="trials at once (default: as many as the cluster's CPUs fit)")
    p.add_argument("--search_seed", "--search-seed", type=int, default=0, help="TPE sampler seed")
    p.add_argument("--startup_trials", "--startup-trials", type=int | None, default=None,
                   help="TPE: trials drawn at random before TPE models the scores (default: half of --num-samples, "
                        "at most 10)")
    p.add_argument("--name", type=str | None, default=None,
                   help="sweep name (folder under --storage-path, parent MLflow run name)")
    p.add_argument("--storage_path", "--storage-path", type=str, default="ray_results",
                   help="where Tune and Train state go (a folder or s3://…)")
    p.add_argument("--experiment", type=str, default="ropim-sweep", help="MLflow experiment of the sweep's runs")
    p.add_argument("--register", type=bool, default=True, help="register the best encoder (champion rule)")
    p.add_argument("--no-register", "--no_register", dest="register", action="store_false",
                   help="do not register the best encoder: the same as --register false "
                        "(--register's default: %(default)s)")
    p.add_argument("--num_workers", "--workers-per-trial", "--workers_per_trial", type=int, default=2,
                   help="Ray Train workers per trial")
    p.add_argument("--cpus_per_worker", "--cpus-per-worker", type=float, default=1.0, help="CPUs per Train worker")
    p.add_class_arguments(PretrainConfig, nested_key=None, as_group=False, skip=NOT_PRETRAIN_FLAGS)
    p.add_class_arguments(FinetuneConfig, nested_key="finetune",
                          help="--metric finetune_top1: each trial's fine-tune recipe and budget (--finetune FILE, "
                               f"--finetune.epochs N, …); {', '.join(FINETUNE_FROM_TRIAL)} are the trial's")
    p.add_class_arguments(SegmentConfig, nested_key="segment",
                          help="--metric segment_miou: each trial's segmentation recipe, budget and data (--segment "
                               "FILE, --segment.data.source PATH, …); workers, seed and encoder are the trial's")
    return p


def config_from_namespace(ns: Namespace, typed: frozenset[str] = frozenset()) -> SweepConfig:
    """The sweep config from the parsed (instantiated) flags; ``--resume NAME`` loads the stored one, changed where
    the command line typed (``typed``: dotted names of the flags it gives) a ``RESUMABLE`` field."""
    pretrain_names = {f.name for f in fields(PretrainConfig)}
    pretrain = PretrainConfig(**{k: v for k, v in ns.items() if k in pretrain_names})
    sweep = {f.name: ns[f.name] for f in fields(SweepConfig)
             if f.name not in ("pretrain", "space", "finetune", "segment") and f.name in ns}
    finetune = {k: v for k, v in asdict(ns.finetune).items() if k not in FINETUNE_FROM_TRIAL}
    segment = {k: v for k, v in asdict(ns.segment).items() if k not in ("encoder", "random_init")}
    given = SweepConfig(**sweep, preset=ns.preset_name, space=ns.space or {}, pretrain=pretrain.to_dict(),
                        finetune=finetune, segment=segment)
    return resumed(ns.resume, given, typed) if ns.resume else given


def sweep_value(cfg: SweepConfig, flag: str) -> object:
    """The value in ``cfg`` of the flag ``flag`` (its dotted name): a sweep field, a field of the trials' fine-tune
    or segmentation, or a pretraining field; None where ``cfg`` has none."""
    flag = "preset" if flag == "preset_name" else flag
    own = flag.split(".")[0] in {f.name for f in fields(SweepConfig)}
    try:
        return field_value(cfg if own else cfg.pretrain, flag)
    except (KeyError, AttributeError):
        return None


def resumed(name: str, given: SweepConfig, typed: frozenset[str]) -> SweepConfig:
    """``--resume name``: the stored sweep under ``given.storage_path``, with the ``RESUMABLE`` fields the command
    line typed; ConfigError naming every other typed flag whose value differs from the stored one."""
    from ropim.checks import check_location
    from ropim.errors import ConfigError
    from ropim.tracking.run_meta import read_run_meta

    check_location(given.storage_path, "storage_path")
    meta = read_run_meta(given.storage_path, name)
    if meta is None:
        raise ConfigError(f"--resume {name}: no sweep of that name under --storage-path {given.storage_path}")
    stored, now = SweepConfig.from_dict(meta["config"]), derived(given)
    fixed = sorted(k for k in typed - {"storage_path", *RESUMABLE} if sweep_value(now, k) != sweep_value(stored, k))
    if fixed:
        changed = ", ".join(f"{k}={sweep_value(now, k)!r} (stored {sweep_value(stored, k)!r})" for k in fixed)
        raise ConfigError(f"--resume {name}: {changed} cannot change when continuing a sweep (only "
                          f"{', '.join(RESUMABLE)} may); drop {' '.join('--' + k for k in fixed)} (or the --preset / "
                          "--config that sets it), or start a new sweep with another --name")
    changes = {k: (sweep_value(stored, k), sweep_value(now, k)) for k in sorted(typed & set(RESUMABLE))
               if sweep_value(now, k) != sweep_value(stored, k)}
    if changes:
        print(f"[sweep] --resume {name}: " + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
              + " (typed); the rest as stored", flush=True)
    pretrain = {**stored.pretrain, **{k: new for k, (_, new) in changes.items() if k != "register"}}
    return dataclasses.replace(stored, pretrain=pretrain, register=now.register if "register" in changes
                               else stored.register)


def config_from_args(argv: list[str]) -> SweepConfig:
    """The sweep config of a command line (without running anything)."""
    p = parser()
    return config_from_namespace(p.instantiate(p.parse_args(argv)), typed_fields(p, argv))


def run(ns: Namespace, typed: frozenset[str] = frozenset()) -> SweepResult:
    """Run (or continue) the sweep the flags describe (``typed``: the flags the command line gives, for
    ``--resume``); bad input fails before Ray Tune and torch are imported (the sweep is prepared once: the driver
    runs the ``PreparedSweep``)."""
    from ropim.data.sources import one_listing

    with one_listing():  # the pre-flight's listing of the data serves every trial
        cfg = prepare(config_from_namespace(ns, typed))
        from tune.driver import run_sweep

        return run_sweep(cfg)


class SweepCommand:
    """``ropim sweep`` as a ``ropim.commands`` entry point."""

    help = HELP

    @staticmethod
    def parser() -> ArgumentParser:
        return parser()

    @staticmethod
    def run(ns: Namespace, typed: frozenset[str] = frozenset()) -> None:
        run(ns, typed)

    @staticmethod
    def presets() -> dict[str, Path]:
        return shipped_presets(PRESETS)


COMMAND = SweepCommand()


def main(argv: list[str] | None = None, quiet: bool | None = None) -> None:
    """``python -m tune.sweep`` / ``jobs/sweep.py``: the same flags as ``ropim sweep``; ``quiet`` as ``ropim``'s."""
    if argv is None if quiet is None else quiet:
        quiet_console()
    p, argv = parser(), list(sys.argv[1:] if argv is None else argv)
    try:
        run(p.instantiate(p.parse_args(argv)), typed_fields(p, argv))
    except ERRORS as err:
        raise SystemExit(f"ropim sweep: {err}") from None
    except ArgumentError as err:
        raise SystemExit(f"ropim sweep: {one_line(err)} (see `ropim sweep --help`)") from None
    except KeyboardInterrupt as err:
        raise SystemExit(stopped("sweep", err)) from None


if __name__ == "__main__":
    main()
