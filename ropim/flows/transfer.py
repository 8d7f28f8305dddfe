"""Transfer tables: the same fine-tune (or probe) of every encoder on every data set, side by side, like the
paper's transfer tables (Flowers102 / CUB-200 / CIFAR-10 / CIFAR-100), and the same segmentation of every encoder on
every ``segment_data`` source (an mIoU column each, as the paper's Table 3 beside them). Each cell is its own MLflow
run (tagged with the encoder version, which also gets its ``downstream.<dataset>.…`` tag); the table is printed and
saved as ``transfer.csv``, ``transfer.md`` and ``transfer.json`` in ``out``. A fine-tune or segmentation cell's
run is named for what it computes (``named``): the same command again, after a stop, reports the finished cells and
continues the stopped one from its last checkpoint.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

from ropim.checks import check_folder
from ropim.data.sources import one_listing
from ropim.errors import ConfigError
from ropim.files import written_whole
from ropim.flows.config import TransferConfig
from ropim.flows.probe import probe, probe_splits
from ropim.paths import job_copy_note
from ropim.tracking import store
from ropim.tracking.encoders import EncoderRef, resolve_encoder
from ropim.tracking.uri import check_tracking, tracking_uri
from ropim.train.downstream import eval_split
from ropim.train.driver import JobResult, run
from ropim.train.finetune.config import FinetuneConfig
from ropim.train.job import dataset_name
from ropim.train.runtime import ray_session
from ropim.train.segment.config import SegmentConfig

RESULTS = ("transfer.csv", "transfer.md", "transfer.json")  # written in ``out`` once every cell has run
# what a stopped cell's run says continues it: its run name is the cell's (``named``)
CONTINUE = "the same ropim transfer command (finished cells are reported, not trained again)"


def check_out(out: str) -> None:
    """``--out`` is a folder the table can be written to, or one that can be created (nothing is created here);
    ConfigError naming it otherwise, so that the results of hours of cells are not lost at the end."""
    check_folder(out, "--out")
    taken = [name for name in RESULTS if (Path(out) / name).is_dir()]
    if taken:
        raise ConfigError(f"--out {out!r} holds a folder named {taken[0]}, where the table is written; move it or "
                          "give another --out")


def preflight(cfg: TransferConfig) -> dict[str, EncoderRef]:
    """Check ``--out``, resolve every encoder and check it against every data set (image size, channels; a probe's
    kNN k against each train split) before any run; each encoder's reference, by the string given."""
    check_out(cfg.out)
    tracking = tracking_uri()
    check_tracking(tracking)
    template = cfg.finetune if cfg.mode == "finetune" else cfg.probe
    refs = {encoder: resolve_encoder(encoder, tracking)[0] for encoder in cfg.encoder_list}
    for ref in refs.values():
        for source in cfg.data_list:
            data = dataclasses.replace(template.data, source=source).resolved()
            img_size = template.img_size or ref.config["img_size"]
            if cfg.mode == "probe":  # its kNN's k fits every train split
                probe_splits(ref, data, img_size, cfg.probe.knn_k, "probe.knn_k")
            else:
                eval_split(ref, data, img_size)
    for encoder, _, cell in cfg.segment_cells():
        cell.check_encoder(refs[encoder].uri, refs[encoder].config)  # the patch size divides the crop
    return refs


def named(cell: FinetuneConfig | SegmentConfig, ref: EncoderRef) -> FinetuneConfig | SegmentConfig:
    """``cell`` named for what it computes: its job, data set and a digest of its config with the encoder pinned (the
    fields a continued run may change left out). The same cell of a later transfer continues its stopped run, or
    reports its finished one, instead of training again; another recipe, seed or encoder version is another cell."""
    spec = {k: v for k, v in dataclasses.replace(cell, encoder=ref.pinned).resolved().to_dict().items()
            if k not in (*cell.RESUMABLE, "run_name") or k == "accum_steps"}  # resumable since: earlier cells' names
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return dataclasses.replace(cell, run_name=f"transfer-{cell.kind}-{dataset_name(cell.data)[:48]}-{digest}")


def cell_result(cell: FinetuneConfig | SegmentConfig, ref: EncoderRef) -> JobResult:
    """Run (continue, or report) a fine-tune or segmentation cell under its ``named`` run, on the version the
    pre-flight pinned (an alias moved meanwhile by a sweep does not change the table's row halfway)."""
    return run(dataclasses.replace(named(cell, ref), encoder=ref.pinned), run_options={"resume": CONTINUE})


def encoder_label(run_id: str, encoder: str) -> str:
    """``name vN`` of the encoder a cell's run started from, else its URI."""
    tags = store.client().get_run(run_id).data.tags
    return f"{tags['ropim.encoder_name']} v{tags['ropim.encoder_version']}" if "ropim.encoder_version" in tags \
        else encoder


def segment_rows(cfg: TransferConfig, refs: dict[str, EncoderRef]) -> list[dict]:
    """Every segmentation cell: mIoU and pixel accuracy on its val split."""
    rows = []
    for encoder, source, cell in cfg.segment_cells():
        t0 = time.perf_counter()
        res = cell_result(cell, refs[encoder])
        rows.append({"encoder": encoder, "encoder_label": encoder_label(res.run_id, encoder), "data": source,
                     "dataset": dataset_name(cell.data), "task": "segment", "miou": res.metrics["miou"],
                     "pixel_acc": res.metrics["pixel_acc"], "run_id": res.run_id,
                     "seconds": round(time.perf_counter() - t0, 1)})
    return rows


def _table(rows: list[dict], encoders: list[str], datasets: list[str], metric: str) -> list[list[str]]:
    """Rows of the wide table: encoder, one column per data set, the mean."""
    by = {(r["encoder"], r["dataset"]): r for r in rows}
    out = []
    for e in encoders:
        cells = [by.get((e, d), {}).get(metric) for d in datasets]
        done = [c for c in cells if c is not None]
        out.append([by[(e, datasets[0])]["encoder_label"] if (e, datasets[0]) in by else e,
                    *[f"{c:.2f}" if c is not None else "—" for c in cells],
                    f"{sum(done) / len(done):.2f}" if len(done) == len(cells) else "—"])
    return out


def format_markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body]) + "\n"


@one_listing()  # each data source listed once for every cell (and handed to each cell's Ray workers)
def transfer(cfg: TransferConfig) -> dict[str, object]:
    """Run every cell, print the table, write CSV / Markdown / JSON; return {'rows', 'markdown', 'files'}."""
    cfg = cfg.resolved().validate()
    refs = preflight(cfg)
    if note := job_copy_note(cfg.out, "out"):
        print(note, flush=True)
    rows = []
    ray = (cfg.mode == "finetune" and cfg.finetune.num_workers > 0) or (cfg.segment_list and cfg.segment.num_workers)
    with ray_session(needed=bool(ray)):  # one for every cell
        for encoder, source, cell in cfg.cells():
            t0 = time.perf_counter()
            if cfg.mode == "finetune":
                result = cell_result(cell, refs[encoder])
                res = {**result.metrics, "run_id": result.run_id}
            else:
                res = probe(dataclasses.replace(cell, encoder=refs[encoder].pinned))
            label = encoder_label(res["run_id"], encoder)
            row = {"encoder": encoder, "encoder_label": label, "data": source, "dataset": dataset_name(cell.data),
                   "top1": res["top1"], "top5": res["top5"], "run_id": res["run_id"],
                   "seconds": round(time.perf_counter() - t0, 1)}
            if cfg.mode == "probe":
                row |= {"knn_top1": res["knn"]["top1"], "knn_top5": res["knn"]["top5"]}
            rows.append(row)
        seg_rows = segment_rows(cfg, refs)

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    seg_sets = list(dict.fromkeys(r["dataset"] for r in seg_rows))
    top1 = "fine-tune top-1 (%)" if cfg.mode == "finetune" else "linear-probe top-1 (%)"
    metric = " and ".join(m for m, shown in ((top1, datasets), ("segmentation mIoU (%)", seg_sets)) if shown)
    header = ["encoder", *([*datasets, "mean"] if datasets else []), *[f"{d} mIoU" for d in seg_sets]]
    n = len(cfg.encoder_list)
    cls_body = _table(rows, cfg.encoder_list, datasets, "top1") if datasets else [None] * n
    seg_body = _table(seg_rows, cfg.encoder_list, seg_sets, "miou") if seg_sets else [None] * n
    body = [[(c or s)[0], *(c[1:] if c else []), *(s[1:-1] if s else [])]  # segmentation: no mean column
            for c, s in zip(cls_body, seg_body, strict=True)]
    md = f"{metric}, val split\n\n" + format_markdown(header, body)
    if cfg.mode == "probe" and datasets:  # the probe cells' rows: a segmentation row of the same data has no kNN
        md += f"\nkNN (k={cfg.probe.knn_k}) top-1 (%)\n\n" + format_markdown(
            ["encoder", *datasets, "mean"], _table(rows, cfg.encoder_list, datasets, "knn_top1"))
    rows += seg_rows
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"csv": out / "transfer.csv", "md": out / "transfer.md", "json": out / "transfer.json"}
    with written_whole(files["csv"]) as tmp, open(tmp, "w", newline="") as f:  # each file whole, never half written
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(body)
    for key, text in (("md", md), ("json", json.dumps({"mode": cfg.mode, "config": asdict(cfg), "rows": rows},
                                                       indent=2))):
        with written_whole(files[key]) as tmp:
            tmp.write_text(text)
    print()
    print(md)
    print("written: " + ", ".join(str(p) for p in files.values()), flush=True)
    return {"rows": rows, "markdown": md, "files": {k: str(v) for k, v in files.items()}}
