"""Impossible and implausible results flagged (issue 40): a speedup above the device count (5%
allowed), an efficiency over 105%, an MFU over 100% (throughput above the compute bound), a
contended or unstable 1-device baseline under a speedup, and no negative "unexplained" share.
The sweep of the issue is tests/golden/impossible-speedup (recorded; its README says what was
edited: the 2-device figure, to the issue's 10.90x); figures are read as matplotlib Axes."""

from __future__ import annotations

import copy
import csv
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.analysis import explain
from bench.analysis.stats import summarise
from bench.plotting import FLAGGED_HATCH, pyplot
from bench.records import columns
from bench.records.store import load_records
from bench.records.trust import (
    SUPERLINEAR_ALLOWANCE,
    baseline_doubts,
    compute_bound,
    doubts,
    speedup_impossible,
)
from bench.report import charts
from bench.report.summary import build_report, format_table
from tests.helpers.cli import REPO
from tests.helpers.records import gpu_record, probe_record, write_folder

SWEEP = REPO / "tests" / "golden" / "impossible-speedup"
MARKED = "10.90x? (baseline contended, unstable)"


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    return load_records(SWEEP)


@pytest.fixture(scope="module")
def rows(records) -> list[dict[str, Any]]:
    return summarise(records)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """The recorded sweep's folder, reported again (summary.csv, charts, report.html,
    results.md)."""
    folder = tmp_path_factory.mktemp("rep") / "impossible-speedup"
    shutil.copytree(SWEEP, folder)
    build_report(folder)
    return folder


def _by_devices(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["num_devices"]: r for r in rows}


def test_the_rules_allow_5_percent_superlinearity() -> None:
    edge = 2 * (1 + SUPERLINEAR_ALLOWANCE)
    assert speedup_impossible(edge, 2) is False
    assert speedup_impossible(edge + 0.01, 2) is True
    assert speedup_impossible(1.9, 2) is False and speedup_impossible(None, 2) is None
    assert baseline_doubts({"contended": True, "unstable": None}) == ["contended"]
    assert compute_bound({"images_per_sec": 120.0, "mfu": 1.2}) == pytest.approx(100.0)


def test_the_issue_sweep_flags_its_2_device_row(rows) -> None:
    one, two = _by_devices(rows)[1], _by_devices(rows)[2]
    assert two["speedup"] == pytest.approx(10.90, abs=0.005)
    assert two["speedup_impossible"] and two["baseline_suspect"]
    assert two["baseline_flags"] == "contended unstable"
    assert not one["speedup_impossible"] and one["baseline_suspect"] is None
    assert set(doubts(two)) == {"speedup", "baseline"} and doubts(one) == {}
    assert "impossible" in doubts(two)["speedup"] and "545%" in doubts(two)["speedup"]


def test_the_terminal_table_never_shows_the_speedup_plain(rows) -> None:
    table = format_table(rows)
    two = next(line for line in table.splitlines() if line.startswith("torch_ddp")
               and " 2 vcpu " in line)
    assert MARKED in two and "545%? (baseline contended, unstable)" in two
    assert "SPEEDUP>N" in two and "BASELINE-SUSPECT" in two
    cells = table.split("\n\n")[0]  # the table itself; the notes under it give the reasons
    assert re.search(r"\b10\.90x(?![?])", cells) is None  # never plain
    assert "Flagged figures (? in the table; not results):" in table
    one = next(line for line in table.splitlines() if " 1 vcpu " in line)
    assert " 1.00x " in one and "baseline" not in one  # the baseline is not its own doubt


def test_summary_csv_and_results_md_carry_the_flags(report) -> None:
    with (report / "summary.csv").open() as fh:
        two = next(r for r in csv.DictReader(fh) if r["num_devices"] == "2")
    assert two["speedup_impossible"] == "True" and two["baseline_suspect"] == "True"
    assert two["baseline_flags"] == "contended unstable"
    md = (report / "results.md").read_text()
    assert f"| {MARKED} | 545%? (baseline contended, unstable) |" in md
    assert "## Flagged figures (not results)" in md and "impossible, so no result" in md


def test_report_html_flags_the_row_and_splits_no_time_negatively(report) -> None:
    page = (report / "report.html").read_text()
    assert f"<td>{MARKED}</td>" in page
    flagged = page.split("<h2>Flagged</h2>")[1].split("<h2>")[0]
    assert "<b>not a result</b>: speedup 10.90x on 2 devices (efficiency 545%)" in flagged
    assert "1-device baseline was contended and unstable" in flagged
    where = page.split(f"<h2>{explain.HEADING}</h2>")[1].split("<h2>")[0]
    assert "split not meaningful" in where and explain.NOT_MEANINGFUL in where
    assert re.search(r"-\d+(\.\d+)?%", where) is None  # no negative share


def _flagged_points(ax: Any) -> list[tuple[float, float]]:
    return [(x, y) for ln in ax.get_lines() if ln.get_label() == "_flagged"
            for x, y in zip(ln.get_xdata(), ln.get_ydata(), strict=True)]


def _texts(fig: Any) -> list[str]:
    from matplotlib.text import Text

    return [t.get_text() for t in fig.findobj(Text)]


@pytest.mark.parametrize("build,value,text", [
    (charts.speedup_figure, 10.90, "10.90x?"),
    (charts.efficiency_figure, 545.0, "545%?"),
    (charts.throughput_figure, 375.3, "375.3?"),
])
def test_charts_draw_the_flagged_point_apart_and_say_why(rows, build, value, text) -> None:
    fig = build(rows, table=[])
    try:
        ax = fig.axes[0]
        (x, y), = _flagged_points(ax)
        assert x == 2 and y == pytest.approx(value, abs=0.05)
        marker = next(ln for ln in ax.get_lines() if ln.get_label() == "_flagged")
        assert marker.get_markerfacecolor() == "white"
        assert text in [t.get_text() for t in ax.texts]
        assert charts.FLAGGED_LABEL in ax.get_legend_handles_labels()[1]
        caption = " ".join(_texts(fig)).replace("\n", " ")
        assert "not a result" in caption and "impossible" in caption
        if build is not charts.throughput_figure:
            assert "baseline was contended and unstable" in caption
    finally:
        pyplot().close(fig)


def test_the_largest_count_bars_are_hatched_when_flagged(rows) -> None:
    fig = charts.largest_figure(rows)
    try:
        bar, = fig.axes[0].patches
        assert bar.get_hatch() == FLAGGED_HATCH
        assert "375.3?" in [t.get_text() for t in fig.axes[0].texts]
        assert "hatched bar" in " ".join(_texts(fig))
    finally:
        pyplot().close(fig)


def test_an_unflagged_sweep_draws_no_flag(rows) -> None:
    """A plausible speedup over a clean baseline: no mark anywhere."""
    plain = copy.deepcopy(rows)
    for r in plain:
        r.update(speedup_impossible=False, baseline_suspect=False, baseline_flags=None)
    fig = charts.speedup_figure(plain, table=[])
    try:
        assert _flagged_points(fig.axes[0]) == []
        assert "not a result" not in " ".join(_texts(fig))
    finally:
        pyplot().close(fig)
    assert "Flagged figures" not in format_table(plain)


def test_mfu_over_100_percent_is_throughput_above_the_compute_bound(records) -> None:
    """One rule: MFU over 100% (mfu.over_peak) is a throughput above the devices' peak over
    the training FLOPs per sample; the MFU cell says so and the throughput chart flags it."""
    edited = copy.deepcopy(records)
    one = next(r for r in edited if r["num_devices"] == 1)
    one["mfu"].update(mfu=1.25, over_peak=True)
    row = next(r for r in summarise(edited) if r["num_devices"] == 1)
    assert columns.cell(columns.column("mfu"), row, "table") == "125.0%? over peak"
    why = doubts(row)["throughput"]
    assert f"compute bound of {row['images_per_sec'] / 1.25:.1f}" in why
    fig = charts.throughput_figure(summarise(edited), table=[])
    try:
        assert (1, pytest.approx(row["images_per_sec"])) in _flagged_points(fig.axes[0])
    finally:
        pyplot().close(fig)


def test_a_contended_baseline_marks_a_plausible_speedup(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0, contended=True),
                                           gpu_record(2, 360.0)])
    row = _by_devices(summarise(load_records(folder)))[2]
    assert not row["speedup_impossible"] and row["baseline_flags"] == "contended"
    assert columns.cell(columns.column("speedup"), row, "table") == "1.80x (baseline contended)"
    assert columns.cell(columns.column("scaling_efficiency"), row, "table") == \
        "90% (baseline contended)"


def test_overlapping_terms_print_no_negative_share(tmp_path: Path) -> None:
    """Communication (an upper bound) beyond what is left of the step: the terms overlap,
    said so, and no negative percentage."""
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, 390.0),
                                           probe_record("torch_allreduce", "torch", 2, 0.5)])
    records = load_records(folder)
    line = explain.explain(summarise([r for r in records if r["mode"] == "benchmark"]),
                           records)[1]
    assert "unexplained none: the terms overlap by" in line
    assert re.search(r"-\d", line) is None
