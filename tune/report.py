"""The sweep's outputs: the ablation table (Markdown, CSV, JSON) and PNG plots (metric vs rho, metric by trial,
Optuna parameter importances). Input is a list of row dicts, one per trial, as ``tune.sweep`` builds them."""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
import warnings
from pathlib import Path

COLUMNS = ("trial", "rho", "base_lr", "epochs", "seed")
TAIL = ("epochs_run", "status", "mlflow_run")


SCORES = ("knn_top1", "linear_top1", "finetune_top1", "segment_miou")


def scores(rows: list[dict], metric: str) -> list[str]:
    """The objective, then the other scores some trial reported (e.g. knn_top1 beside finetune_top1)."""
    return [metric, *(s for s in SCORES if s != metric and any(r.get(s) is not None for r in rows))]


def columns(rows: list[dict], metric: str) -> list[str]:
    """Table columns: trial and the usual knobs, any other swept knob, the scores, then status."""
    extra = sorted({k for r in rows for k in r.get("knobs", ())} - set(COLUMNS))
    return [*COLUMNS, *extra, *scores(rows, metric), *TAIL]


def _fmt(key: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if key in ("base_lr", "lr") and isinstance(value, float):
        return f"{value:.2e}"
    if key == "rho" and isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def to_csv(rows: list[dict], metric: str) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns(rows, metric), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def by_rho(rows: list[dict], metric: str) -> list[tuple[float, float, float, int]]:
    """(rho, mean, std, n) of the metric over the trials at each rho (finished trials with a value)."""
    groups: dict[float, list[float]] = {}
    for r in rows:  # not a failed trial's last score, nor one stopped early at an earlier epoch's
        if r.get(metric) is not None and r.get("status", "finished") == "finished":
            groups.setdefault(round(float(r["rho"]), 6), []).append(float(r[metric]))
    return [(rho, statistics.fmean(v), statistics.pstdev(v), len(v)) for rho, v in sorted(groups.items())]


def to_markdown(rows: list[dict], metric: str, title: str, grid_over_rho: bool) -> str:
    """The per-trial table, and for a grid over rho the paper-style one-line table (mean ± std over seeds)."""
    cols = columns(rows, metric)
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(c, r.get(c)) for c in cols) + " |" for r in rows]
    for score in scores(rows, metric) if grid_over_rho else ():
        summary = by_rho(rows, score)
        if not summary:
            continue
        best = max(m for _, m, _, _ in summary)
        cells = [(f"**{m:.2f}**" if m == best else f"{m:.2f}") + (f" ± {s:.2f}" if n > 1 else "")
                 for _, m, s, n in summary]
        lines += ["", f"{score} (%) by rho" + (f", mean ± std over {summary[0][3]} seeds" if summary[0][3] > 1
                                               else "") + ":", "",
                  "| " + " | ".join(f"ρ={rho:g}" for rho, *_ in summary) + " |", "|" + "---|" * len(summary),
                  "| " + " | ".join(cells) + " |"]
    return "\n".join(lines) + "\n"


def plot_metric_vs_rho(rows: list[dict], metric: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    done = [r for r in rows if r.get(metric) is not None]
    ax.scatter([r["rho"] for r in done], [r[metric] for r in done], alpha=0.7, label="trials")
    summary = by_rho(rows, metric)
    if len(summary) < len(done) or len(summary) <= 6:
        ax.plot([s[0] for s in summary], [s[1] for s in summary], "-o", color="C1", label="mean per rho")
    ax.set(xlabel="rho (sketch ratio K'/N)", ylabel=f"{metric} (%)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_metric_by_trial(rows: list[dict], metric: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    values = [r.get(metric) for r in rows]
    xs = [i + 1 for i, v in enumerate(values) if v is not None]
    ys = [values[i - 1] for i in xs]
    running = [max(ys[: j + 1]) for j in range(len(ys))]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    colors = ["C0" if rows[i - 1].get("status") == "finished" else "C7" for i in xs]
    ax.scatter(xs, ys, c=colors, label="trial (grey: stopped early)")
    ax.step(xs, running, where="post", color="C1", label="best so far")
    ax.set(xlabel="trial (creation order)", ylabel=f"{metric} (%)", title=title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def rebuild_study(rows: list[dict], space: dict, metric: str):
    """An Optuna study holding the trials' knob values and metric (for importances without the searcher)."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    dists = {}
    for knob, dist in space.items():
        kind, args = next(iter(dist.items()))
        dists[knob] = (FloatDistribution(args[0], args[1], log=kind == "loguniform")
                       if kind in ("uniform", "loguniform") else CategoricalDistribution(list(args)))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for r in rows:
        if r.get(metric) is not None:
            study.add_trial(optuna.trial.create_trial(params={k: r[k] for k in dists}, distributions=dists,
                                                      value=float(r[metric])))
    return study


def importances(study) -> dict[str, float]:
    """Optuna's parameter importances (fANOVA) of a study; {} with fewer than 2 completed trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < 2 or not done[0].params:
        return {}
    return dict(optuna.importance.get_param_importances(study))


def plot_importances(study, imp: dict[str, float], path: Path, title: str) -> None:
    """Optuna's own importance plot of ``study`` (its matplotlib backend), or a note when there is too little."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    if imp:
        with warnings.catch_warnings():  # Optuna marks its matplotlib plots experimental
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            ax = optuna.visualization.matplotlib.plot_param_importances(study)
        fig = ax.figure
        ax.set_title(f"{title}: hyperparameter importances (Optuna fANOVA)", loc="left")
    else:
        fig, ax = plt.subplots(figsize=(5, 2.5))
        ax.text(0.5, 0.5, "needs ≥ 2 finished trials", ha="center", va="center")
        ax.set_axis_off()
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: list[dict], metric: str, folder: Path, title: str, *, grid_over_rho: bool,
                 study=None) -> dict[str, Path]:
    """Write table and plots into ``folder``; return {name: path}. An Optuna ``study`` adds the TPE plots."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"ablation.md": folder / "ablation.md", "ablation.csv": folder / "ablation.csv",
             "results.json": folder / "results.json", "metric_vs_rho.png": folder / "metric_vs_rho.png"}
    files["ablation.md"].write_text(to_markdown(rows, metric, title, grid_over_rho))
    files["ablation.csv"].write_text(to_csv(rows, metric))
    files["results.json"].write_text(json.dumps(rows, indent=2, default=str))
    plot_metric_vs_rho(rows, metric, files["metric_vs_rho.png"], title)
    if study is not None:
        files["metric_by_trial.png"] = folder / "metric_by_trial.png"
        files["param_importances.png"] = folder / "param_importances.png"
        plot_metric_by_trial(rows, metric, files["metric_by_trial.png"], title)
        imp = importances(study)
        plot_importances(study, imp, files["param_importances.png"], title)
        files["importances.json"] = folder / "importances.json"
        files["importances.json"].write_text(json.dumps(imp, indent=2))
    return files
