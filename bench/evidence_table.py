"""The GPU evidence over its seeds: every ``bench/gpu_evidence.py`` JSON read, one column per seed, mean ± sd per
method, and the paired comparison of ROPIM and SimMIM (the difference per seed, the seeds ROPIM leads, a paired
t-test and the Wilcoxon signed-rank test). What ``docs/speed.md``'s table and reading are made from.

    python bench/evidence_table.py                                   # bench/results/gpu_evidence*.json
    python bench/evidence_table.py A.json B.json --out summary.json

Runs of one seed must not repeat (a second file of a seed is refused, naming both), and every file must hold the same
methods: a comparison across seeds only means something when each seed ran all of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from record import write_json
from scipy import stats

RESULTS = Path(__file__).resolve().parent / "results"
PAIR = ("ROPIM", "SimMIM")  # the two pretrainings compared seed by seed


def label(row: dict) -> str:
    """A row's method as the table names it: layer decay shown where one method was fine-tuned both ways."""
    if row["method"] != "none":
        return row["method"]
    return f"none (layer decay {row['layer_decay']})" if row["layer_decay"] else "none (no layer decay)"


def read(paths: list[Path]) -> dict[int, dict]:
    """{seed: {"device": short GPU name, "top1": {method: top-1}, "epochs": {pretraining or "fine-tune": epochs},
    "file": its path}} of the files; SystemExit naming a bad one."""
    runs: dict[int, dict] = {}
    for path in paths:
        try:
            d = json.loads(path.read_text())
            top1 = {label(r): r["finetune"]["top1"] for r in d["rows"]}
            epochs = {r["method"]: r["pretrain"]["epochs"] for r in d["rows"] if r.get("pretrain")}
            epochs["fine-tune"] = d["rows"][0]["finetune"]["epochs"]
            seed, device, complete = d["seed"], d["device_name"], d.get("complete", True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"{path}: not a gpu_evidence.py result ({type(e).__name__}: {e})") from None
        if not complete:
            raise SystemExit(f"{path}: an incomplete run (it stopped before every method was fine-tuned); leave it out")
        if seed in runs:
            raise SystemExit(f"{path}: seed {seed} again (also {runs[seed]['file']}); give each seed once")
        runs[seed] = {"device": device.replace("NVIDIA ", "").split()[0], "top1": top1, "epochs": epochs, "file": path}
    methods = {tuple(r["top1"]) for r in runs.values()}
    if len(methods) > 1:
        raise SystemExit(f"the files hold different methods ({' / '.join(', '.join(m) for m in sorted(methods))}); "
                         "compare runs of one gpu_evidence.py version")
    return dict(sorted(runs.items()))


def summarize(runs: dict[int, dict]) -> dict:
    """Per method its top-1 per seed, mean and sd; the paired ROPIM − SimMIM comparison (at least 2 seeds)."""
    if len(runs) < 2:
        raise SystemExit(f"{len(runs)} seed(s): a spread and a paired test need at least 2")
    first = next(iter(runs.values()))
    table = {m: [runs[s]["top1"][m] for s in runs] for m in first["top1"]}
    a, b = table[PAIR[0]], table[PAIR[1]]
    diff = [x - y for x, y in zip(a, b, strict=True)]
    test = stats.ttest_rel(a, b)
    return {"seeds": list(runs), "devices": [runs[s]["device"] for s in runs],
            "epochs": {k: [runs[s]["epochs"][k] for s in runs] for k in first["epochs"]},
            "methods": {m: {"top1": v, "mean": statistics.mean(v), "sd": statistics.stdev(v)}
                        for m, v in table.items()},
            "paired": {"diff": diff, "mean": statistics.mean(diff), "sd": statistics.stdev(diff),
                       "leads": sum(d > 0 for d in diff), "seeds": len(diff),
                       "t": float(test.statistic), "t_p": float(test.pvalue),
                       "wilcoxon_p": float(stats.wilcoxon(a, b).pvalue)}}


def markdown(s: dict) -> str:
    """The table of ``docs/speed.md`` (top-1 per method, then the epochs each seed's seconds bought) and the paired
    line under it."""
    seeds = [f"seed {seed} ({dev})" for seed, dev in zip(s["seeds"], s["devices"], strict=True)]
    head = ["method", *seeds, "mean ± sd"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, r in s["methods"].items():
        lines.append(f"| {m} | " + " | ".join(f"{v:.2f}" for v in r["top1"]) + f" | {r['mean']:.2f} ± {r['sd']:.2f} |")
    for k, v in s["epochs"].items():
        name, fmt = ("fine-tune", "{}") if k == "fine-tune" else (f"{k} pretraining", "{:.1f}")
        lines.append(f"| {name} epochs | " + " | ".join(fmt.format(e) for e in v) + " | |")
    p = s["paired"]
    lines.append(f"\n{PAIR[0]} − {PAIR[1]} per seed: {', '.join(f'{d:.2f}' for d in p['diff'])}; mean "
                 f"{p['mean']:.2f} ± {p['sd']:.2f}; {PAIR[0]} leads in {p['leads']} of {p['seeds']}; paired t-test "
                 f"t = {p['t']:.2f}, p = {p['t_p']:.3g}; Wilcoxon signed-rank p = {p['wilcoxon_p']:.3g}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="gpu_evidence.py JSONs (default: bench/results/"
                        "gpu_evidence*.json)")
    parser.add_argument("--out", type=Path, help="also write the summary as JSON")
    args = parser.parse_args(argv)
    files = args.files or sorted(RESULTS.glob("gpu_evidence*.json"))
    summary = summarize(read(files))
    print(markdown(summary))
    if args.out:
        write_json({"files": [str(f) for f in files], **summary}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
