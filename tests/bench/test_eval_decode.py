"""bench/eval_decode.py times an evaluation pass decoded here and in DataLoader processes over the JPEGs it makes:
every image scored, the same scores both ways."""

from __future__ import annotations

from support import bench_module


def test_eval_decode_scores_every_image_alike_both_ways(tmp_path):
    with bench_module("eval_decode") as bench:
        out = str(tmp_path / "r.json")
        report = bench.main(["--synthetic", "60", "--processes", "1", "--repeats", "1", "--out", out])
    assert report["images"] == 60 and report["scores_equal"] and set(report["median_seconds"]) == {"0", "1"}
    assert all(s > 0 for s in report["median_seconds"].values()) and (tmp_path / "r.json").exists()
