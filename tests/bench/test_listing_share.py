"""bench/listing_share.py measures the walk and the pickled listing of the tree it makes: every file counted."""

from __future__ import annotations

from support import bench_module


def test_listing_share_counts_every_file_of_its_tree(tmp_path):
    with bench_module("listing_share") as bench:
        report = bench.main(["--files", "300", "--classes", "3", "--repeats", "1", "--out", str(tmp_path / "r.json")])
    assert report["images"] == 300 and report["pickled_mib"] > 0 and report["walk_s"] > 0
    assert (tmp_path / "r.json").exists()
