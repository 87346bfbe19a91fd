"""Charts that help (issue 30): one chart per question, axes fitted to the measured data with
published figures drawn beside or marked off axis, "virtual CPU devices" in the title, series
told apart by marker and line style (greyscale), error bars named. Figures are read as
matplotlib Axes, not pixels; the rows come from the real records in
tests/golden/converge-results or from tests/test_published.py's schema-valid records."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.stats import summarise
from bench.plotting import pyplot
from bench.records.store import load_records
from bench.report import charts
from tests.helpers.cli import REPO
from tests.helpers.records import model_record

GOLDEN = REPO / "tests" / "golden" / "converge-results"


@pytest.fixture(scope="module")
def golden_rows() -> list[dict[str, Any]]:
    """The summary rows of a real sweep: 3 runners on 1 and 2 virtual CPU devices."""
    return summarise(load_records(GOLDEN))


def _close(fig: Any) -> None:
    pyplot().close(fig)


def _series(ax: Any) -> list[tuple[str, str]]:
    """(marker, line style) of each legend entry that is a line (ideal lines included)."""
    return [(str(ln.get_marker()), str(ln.get_linestyle())) for ln in ax.get_lines()
            if not ln.get_label().startswith("_")]


def _published(gpus: int, ips: float, source: str = "Example 2017") -> dict[str, Any]:
    return {"model": "resnet50", "gpus": gpus, "data": "synthetic", "precision": "fp32",
            "images_per_sec": ips, "scaling_efficiency": 1.0, "series": source,
            "system": "sys", "gpu": "P100", "source_short": source}


def test_throughput_axis_fits_the_measured_data_and_marks_a_far_published_figure() -> None:
    """A published figure 100x the measured maximum is not drawn at its value: the y axis
    stays within a small factor of the measured data, a triangle on the top edge carries
    the figure in text; one within 3x is drawn at its value as a hollow marker."""
    rows = summarise([model_record("resnet50", 1, 10.0), model_record("resnet50", 2, 18.0)])
    table = [_published(1, 1800.0), _published(2, 30.0, "Near 2019")]
    fig = charts.throughput_figure(rows, table)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    assert 18.0 < ax.get_ylim()[1] <= 2 * 30.0  # the near figure fits, the far one does not
    texts = [t.get_text() for t in ax.texts]
    assert "published Example 2017: 1,800 img/s ↑" in texts
    labels = ax.get_legend_handles_labels()[1]
    assert "published: P100, Example 2017: 1,800 img/s at 1, off axis" in labels
    near = next(ln for ln in ax.get_lines() if ln.get_label() == "published: P100, Near 2019")
    assert list(near.get_ydata()) == [30.0] and near.get_markerfacecolor() == "none"
    assert all(max(ln.get_ydata(), default=0) < 1800 for ln in ax.get_lines())
    _close(fig)


def test_no_published_figure_leaves_the_axis_on_the_measured_data(golden_rows) -> None:
    fig = charts.throughput_figure(golden_rows)  # small_cnn: nothing published
    ax = fig.axes[0]
    top = max(max(r["images_per_sec_ci_high"], 2 * r["images_per_sec"] / r["num_devices"])
              for r in golden_rows)  # error bars and the ideal line at 2 devices
    assert ax.get_ylim() == pytest.approx((0, top * charts.HEADROOM))
    assert len(ax.texts) == 0
    _close(fig)


def test_values_spanning_decades_get_a_log_axis() -> None:
    rows = summarise([model_record("resnet50", 1, 2.0), model_record("resnet50", 2, 3.0)])
    gpu = copy.deepcopy(rows)
    for r in gpu:
        r.update(runner="other", images_per_sec=r["images_per_sec"] * 500)
    fig = charts.throughput_figure(rows + gpu, [])
    assert fig.axes[0].get_yscale() == "log"
    _close(fig)
    fig = charts.throughput_figure(rows, [])
    assert fig.axes[0].get_yscale() == "linear"
    _close(fig)


FIGURES: dict[str, Callable[..., Any]] = {
    "throughput": charts.throughput_figure, "speedup": charts.speedup_figure,
    "efficiency": charts.efficiency_figure, "memory": charts.memory_figure,
    "largest": charts.largest_figure}


def _with_memory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = copy.deepcopy(rows)
    for r in rows:
        r.update(memory_peak_bytes=2**30 * r["num_devices"], model_state_bytes=2**20)
    return rows


@pytest.mark.parametrize("name", FIGURES)
def test_titles_say_virtual_cpu_devices(golden_rows, name: str) -> None:
    """Not only small print: the figure's title says so when a row is virtual, not else."""
    rows = _with_memory(golden_rows)
    assert all(r["virtual_devices"] for r in rows)
    fig = FIGURES[name](rows)
    assert "virtual CPU devices" in fig.get_suptitle()
    _close(fig)
    for r in rows:
        r["virtual_devices"] = False
    fig = FIGURES[name](rows)
    assert "virtual CPU devices" not in fig.get_suptitle()
    _close(fig)


def test_every_series_has_its_own_marker_and_line_style(golden_rows) -> None:
    """Colour alone does not tell series apart: in greyscale, each legend line of a chart
    (measured series, published systems, ideal lines) differs in marker or line style."""
    many = []
    for i in range(8):  # 24 series: 8 runners x 3 configurations
        for r in copy.deepcopy(golden_rows):
            r["runner"] = f"{r['runner']}{i}"
            many.append(r)
    for build in (charts.throughput_figure, charts.speedup_figure, charts.efficiency_figure,
                  charts.memory_figure):
        fig = build(_with_memory(many))
        pairs = _series(fig.axes[0])
        assert len(pairs) >= 24 and len(set(pairs)) == len(pairs), (build.__name__, pairs)
        _close(fig)
    # measured beside published.csv's resnet50 systems at 1, 2 and 8 GPUs, drawn at value
    gpu = summarise([model_record("resnet50", 1, 200.0), model_record("resnet50", 2, 390.0),
                     model_record("resnet50", 8, 1500.0)])
    for build in (charts.throughput_figure, charts.efficiency_figure):
        fig = build(gpu)
        pairs = _series(fig.axes[0])
        assert len(pairs) > 10 and len(set(pairs)) == len(pairs), (build.__name__, pairs)
        _close(fig)


def test_error_bars_are_named_from_the_rows_interval(golden_rows) -> None:
    def legend(rows: list[dict[str, Any]]) -> list[str]:
        fig = charts.throughput_figure(rows)
        labels = fig.axes[0].get_legend_handles_labels()[1]
        _close(fig)
        return [t for t in labels if t.startswith("error bars")]

    # the golden sweep has 2 repeats a configuration: summarise names their range
    assert {r["interval"] for r in golden_rows} == {"range"}
    assert legend(golden_rows) == ["error bars: min-max range (2 repeats)"]
    rows = copy.deepcopy(golden_rows)
    for r in rows:
        r.pop("interval")
    assert legend(rows) == []  # rows without `interval`: no caption
    for r in rows:
        r["interval"] = "range"
    rows[0]["interval"] = "95% bootstrap CI"
    assert legend(rows) == ["error bars: 95% bootstrap CI (2 repeats); "
                            "min-max range (2 repeats)"]


def test_speedup_and_efficiency_draw_their_ideal(golden_rows) -> None:
    fig = charts.speedup_figure(golden_rows)
    ideal = next(ln for ln in fig.axes[0].get_lines()
                 if ln.get_label() == "ideal (speedup = devices)")
    assert list(ideal.get_xdata()) == list(ideal.get_ydata()) == [1, 2]
    _close(fig)
    fig = charts.efficiency_figure(golden_rows)
    ax = fig.axes[0]
    ideal = next(ln for ln in ax.get_lines() if ln.get_label() == "ideal (100%)")
    assert list(ideal.get_ydata()) == [100.0, 100.0]
    assert max(ln.get_ydata()[-1] for ln in ax.get_lines()
               if ln.get_label().startswith("tf_mirrored")) == pytest.approx(
        100 * next(r["scaling_efficiency"] for r in golden_rows
                   if r["runner"] == "tf_mirrored" and r["num_devices"] == 2))
    _close(fig)


def test_the_question_charts_are_written_and_named_as_documented(golden_rows,
                                                                  tmp_path: Path) -> None:
    """throughput, speedup, efficiency (build_report of a real sweep's records) and memory
    per device (where recorded) each in its own file, the names those of results/README.md
    and docs/DESIGN.md."""
    out = tmp_path / "sweep"
    shutil.copytree(GOLDEN, out)
    from bench.report.summary import build_report

    _, _, written = build_report(out)
    names = {p.name for p in written}
    assert set(charts.CHARTS) <= names and charts.MEMORY_CHART not in names  # none recorded
    memory = charts.render_memory_chart(out, _with_memory(golden_rows))
    assert memory == out / "charts" / charts.MEMORY_CHART
    for name in charts.QUESTION_CHARTS:
        assert (out / "charts" / name).stat().st_size > 5000, name
    docs = (REPO / "results" / "README.md").read_text() + (REPO / "docs" / "DESIGN.md").read_text()
    for name in (*charts.QUESTION_CHARTS, *charts.CHARTS):
        assert f"charts/{name}" in docs or name in docs, name


def test_a_token_models_rate_axis_says_samples_not_images(golden_rows) -> None:
    """Issue 42, item 1: GPT-2's images/sec is sequences per second: its throughput and
    largest-count panels say samples/sec; an image model's keep images/sec."""
    from bench.run.progress import outcome_detail

    for make in (charts.throughput_figure, charts.largest_figure):
        fig = make(golden_rows)
        assert fig.axes[0].get_ylabel() == "images/sec"
        _close(fig)
        tokens = [{**r, "tokens_per_sec": r["images_per_sec"] * 64}
                  if r["images_per_sec"] is not None else r for r in golden_rows]
        fig = make(tokens)
        assert fig.axes[0].get_ylabel() == "samples/sec (sequences)"
        _close(fig)
    line = outcome_detail({"status": "ok", "images_per_sec": 10.0, "tokens_per_sec": 640.0})
    assert line == "10.0 samples/s, 640.0 tok/s"
    assert outcome_detail({"status": "ok", "images_per_sec": 10.0}) == "10.0 img/s"


def test_the_largest_count_panel_says_one_device_in_the_singular(golden_rows) -> None:
    """Issue 42, item 6: "1 virtual CPU devices" read wrong."""
    fig = charts.largest_figure([r for r in golden_rows if r["num_devices"] == 1])
    assert fig.axes[0].get_title().endswith(": 1 virtual CPU device"), fig.axes[0].get_title()
    _close(fig)
    fig = charts.largest_figure(golden_rows)
    assert fig.axes[0].get_title().endswith(": 2 virtual CPU devices")
    _close(fig)


def _timed_out(model: str, n: int) -> dict[str, Any]:
    rec = model_record(model, n, 1.0)
    rec.update(status="timeout", reason="exceeded timeout_s=300; process group killed",
               images_per_sec=None, step_times_s=None)
    return rec


def test_a_configuration_that_failed_is_marked_on_every_question_chart() -> None:
    """Issue 42 item 6: the 2-device run that timed out is a red x at 2 devices with its
    status, named in the caption, and an empty bar labelled timeout at the largest count;
    it never leaves a 1-point chart that says nothing of it."""
    rows = summarise([model_record("resnet50", 1, 10.0), _timed_out("resnet50", 2)])
    for build in (charts.throughput_figure, charts.speedup_figure, charts.efficiency_figure):
        fig = build(rows, [])
        ax = fig.axes[0]
        [x] = [ln for ln in ax.get_lines() if ln.get_label() == "_failed"]
        assert list(x.get_xdata()) == [2] and 2 in list(ax.get_xticks())
        assert "timeout" in [t.get_text() for t in ax.texts]
        assert "Failed, no figure: " in fig._supxlabel.get_text()
        assert "resnet50, 2 devices: timeout" in fig._supxlabel.get_text().replace("\n", " ")
        _close(fig)
    fig = charts.largest_figure(rows)
    ax = fig.axes[0]
    assert ax.get_title() == "resnet50: 2 virtual CPU devices"
    assert [t.get_text() for t in ax.texts] == ["timeout: no figure"]
    _close(fig)


def test_a_report_of_a_folder_without_figures_writes_no_empty_chart_and_drops_stale_ones(
        tmp_path: Path) -> None:
    """Issue 42 item 9: charts of a folder whose runs gave no figure are not drawn on empty
    0-1 axes, and charts an earlier report wrote (memory_per_device.png) are removed."""
    folder = tmp_path / "charts"
    folder.mkdir()
    for name in (*charts.CHARTS, charts.MEMORY_CHART):
        (folder / name).write_bytes(b"old")
    rows = summarise([_timed_out("resnet50", 1), _timed_out("resnet50", 2)])
    assert charts.render_charts(tmp_path, rows) == []
    assert charts.render_memory_chart(tmp_path, rows) is None
    assert list(folder.iterdir()) == []
