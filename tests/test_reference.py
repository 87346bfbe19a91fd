"""The published multi-node figures (reference/multi_node.csv) are whole and sourced."""

from __future__ import annotations

import csv

from tests.helpers.cli import REPO


def test_multi_node_anchors_name_their_source_and_add_up() -> None:
    rows = list(csv.DictReader((REPO / "reference" / "multi_node.csv").open()))
    assert rows
    for row in rows:
        assert row["source"] and row["url"].startswith("https://"), row
        assert int(row["nodes"]) * int(row["gpus_per_node"]) == int(row["gpus"]), row
        eff = float(row["scaling_efficiency"])
        assert 0 < eff <= 1 and int(row["efficiency_baseline_gpus"]) < int(row["gpus"]), row
    sources = {r["url"] for r in rows}
    assert "https://arxiv.org/abs/1706.02677" in sources  # Goyal et al. 2017
    assert "https://arxiv.org/abs/1802.05799" in sources  # Sergeev and Del Balso 2018
    goyal = next(r for r in rows if r["url"].endswith("1706.02677"))
    assert (goyal["model"], goyal["gpus"], goyal["batch_per_gpu"]) == ("resnet50", "256", "32")
