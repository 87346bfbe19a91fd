"""Summary maths: speedup and scaling efficiency against the 1-device run of the same group."""

from __future__ import annotations

import pytest

from bench.analysis.stats import (
    BOOTSTRAP_CI,
    NO_INTERVAL,
    RANGE,
    efficiency,
    interval_name,
    interval_notes,
    median_interval,
    ratio_interval,
    speedup,
    summarise,
)
from bench.records import columns
from tests.helpers.records import summary_row


def test_speedup_and_efficiency() -> None:
    assert speedup(150.0, 100.0) == 1.5
    assert efficiency(1.5, 2) == 0.75
    assert speedup(None, 100.0) is None and speedup(100.0, None) is None
    assert efficiency(None, 2) is None


def test_summary_against_one_device_baseline() -> None:
    rows = summarise([summary_row(1, 100.0), summary_row(2, 180.0), summary_row(4, 300.0)])
    by_n = {r["num_devices"]: r for r in rows}
    assert by_n[1]["speedup"] == 1.0 and by_n[1]["scaling_efficiency"] == 1.0
    assert by_n[2]["speedup"] == pytest.approx(1.8)
    assert by_n[2]["scaling_efficiency"] == pytest.approx(0.9)
    assert by_n[4]["scaling_efficiency"] == pytest.approx(0.75)


def test_repeats_are_averaged_and_failures_counted() -> None:
    rows = summarise([summary_row(1, 100.0), summary_row(1, 120.0, repeat=1), summary_row(2, 200.0),
                      summary_row(2, None, status="timeout", repeat=1)])
    by_n = {r["num_devices"]: r for r in rows}
    assert by_n[1]["images_per_sec"] == pytest.approx(110.0)
    assert by_n[1]["images_per_sec_std"] == pytest.approx(14.1421, rel=1e-4)
    assert by_n[2]["runs_ok"] == 1 and by_n[2]["runs_total"] == 2
    assert by_n[2]["speedup"] == pytest.approx(200 / 110)


def test_groups_do_not_mix() -> None:
    rows = summarise([summary_row(1, 100.0), summary_row(2, 150.0),
                      summary_row(1, 50.0, precision="bf16"),
                      summary_row(2, 100.0, precision="bf16"),
                      summary_row(2, 10.0, model="other")])
    got = {(r["precision"], r["model"], r["num_devices"]): r["speedup"] for r in rows}
    assert got[("fp32", "m", 2)] == pytest.approx(1.5)
    assert got[("bf16", "m", 2)] == pytest.approx(2.0)
    assert got[("fp32", "other", 2)] is None  # no 1-device baseline


def test_failed_baseline_gives_no_speedup() -> None:
    rows = summarise([summary_row(1, None, status="failed"), summary_row(2, 100.0)])
    assert all(r["speedup"] is None for r in rows)
    assert rows[0]["status"] == "failed" and rows[0]["reason"] == "boom"


def test_strong_scaling_groups_by_global_batch() -> None:
    rows = summarise([summary_row(1, 100.0, scaling="strong", global_batch_size=64),
                      summary_row(2, 160.0, scaling="strong", global_batch_size=64,
                                  batch_size_per_device=32)])
    assert rows[1]["speedup"] == pytest.approx(1.6)


def real(n: int, ips: float | None, workers: int = 4, **kw: object) -> dict:
    return summary_row(n, ips, data="real",
                       dataset={"path": "/d", "augmentation": "crop-flip", "workers": workers},
                       **kw)


def test_real_rows_compare_to_synthetic_and_flag_input_bound() -> None:
    from bench.analysis.stats import summarise as s

    rows = s([summary_row(1, 100.0), summary_row(2, 200.0), real(1, 95.0), real(2, 120.0),
              real(2, 190.0, workers=8), summary_row(1, 50.0, precision="bf16")])
    by = {(r["data_label"], r["num_devices"], r["precision"]): r for r in rows}
    assert by[("real-w4", 1, "fp32")]["real_vs_synthetic"] == pytest.approx(0.95)
    assert by[("real-w4", 1, "fp32")]["input_bound"] is False
    assert by[("real-w4", 2, "fp32")]["real_vs_synthetic"] == pytest.approx(0.6)
    assert by[("real-w4", 2, "fp32")]["input_bound"] is True
    assert by[("real-w8", 2, "fp32")]["input_bound"] is False  # 0.95: more workers fed it
    # real rows have their own speedup baseline (real at 1 device, same workers)
    assert by[("real-w4", 2, "fp32")]["speedup"] == pytest.approx(120 / 95)
    assert by[("real-w8", 2, "fp32")]["speedup"] is None
    assert by[("real-w4", 1, "fp32")]["loader_workers"] == 4
    for key in [("synthetic", 1, "fp32"), ("synthetic", 1, "bf16")]:
        assert by[key]["real_vs_synthetic"] is None and by[key]["input_bound"] is None


def test_real_row_without_a_synthetic_twin_is_not_flagged() -> None:
    rows = summarise([real(1, 10.0), summary_row(1, 100.0, precision="bf16")])
    row = next(r for r in rows if r["data"] == "real")
    assert row["real_vs_synthetic"] is None and row["input_bound"] is None


def pipe(name: str, workers: int, ips: float | None, status: str = "ok", **kw: object) -> dict:
    result = {"images_per_sec_per_core": ips / max(1, workers) if ips else None,
              "image_size": 32, "cores": 2}
    return summary_row(1, ips, status=status, runner=name, mode="pipeline", data="real",
                       dataset={"path": "/d", "augmentation": "crop-flip", "workers": workers},
                       result=result, **kw)


def test_pipeline_rows_are_apart_and_compared_to_the_naive_loop() -> None:
    from bench.analysis.stats import summarise_pipelines

    records = [pipe("pil_loop", 0, 100.0), pipe("tf_data", 1, 150.0), pipe("tf_data", 2, 280.0),
               pipe("tf_data", 2, 320.0, repeat=1), pipe("grain", 2, None, status="failed"),
               summary_row(1, 50.0)]
    assert [r["runner"] for r in summarise(records)] == ["r"]  # pipelines stay out
    rows = summarise_pipelines(records)
    assert [(r["pipeline"], r["loader_workers"]) for r in rows] == [
        ("pil_loop", 0), ("grain", 2), ("tf_data", 1), ("tf_data", 2)]
    by = {(r["pipeline"], r["loader_workers"]): r for r in rows}
    assert by[("tf_data", 2)]["images_per_sec"] == 300.0
    assert by[("tf_data", 2)]["runs_ok"] == 2 and by[("tf_data", 2)]["vs_baseline"] == 3.0
    assert by[("tf_data", 2)]["images_per_sec_per_core"] == 150.0
    assert by[("pil_loop", 0)]["vs_baseline"] == 1.0
    assert by[("grain", 2)]["status"] == "failed" and by[("grain", 2)]["vs_baseline"] is None
    assert by[("grain", 2)]["reason"] == "boom"


def test_table_and_chart_show_real_vs_synthetic(tmp_path) -> None:
    from bench.report.charts import render_real_chart
    from bench.report.summary import format_table

    rows = summarise([summary_row(1, 100.0), summary_row(2, 200.0), real(1, 95.0), real(2, 120.0)])
    table = format_table(rows)
    assert "real-w4" in table and "0.95" in table and "0.60 INPUT-BOUND" in table
    assert "INPUT-BOUND: real data below 90%" in table
    chart = render_real_chart(tmp_path, rows)
    assert chart is not None and chart.stat().st_size > 0
    assert render_real_chart(tmp_path, summarise([summary_row(1, 100.0)])) is None


def test_summary_shows_placement_and_batchnorm_from_the_records() -> None:
    """placed_devices is the fewest devices any ok run's framework-read placement named; the
    collapse note and the BatchNorm scope come from the runner's result; the table shows them."""
    from bench.report.summary import format_table

    spread = {"placement": {"rank0:cpu": 8, "rank1:cpu": 8},
              "result": {"batchnorm": "per_device"}}
    collapsed = {"placement": {"cpu(0)": 2},
                 "result": {"placement_collapsed": "keras-mxnet maps cpu(i) to cpu(0)"}}
    rows = summarise([summary_row(1, 100.0, placement={"rank0:cpu": 8}),
                      summary_row(2, 180.0, **spread),
                      summary_row(2, 170.0, runner="k", **collapsed)])
    by = {(r["runner"], r["num_devices"]): r for r in rows}
    assert by[("r", 1)]["placed_devices"] == 1 and by[("r", 2)]["placed_devices"] == 2
    assert by[("r", 2)]["batchnorm"] == "per_device" and by[("r", 1)]["batchnorm"] is None
    assert by[("k", 2)]["placed_devices"] == 1
    assert "cpu(0)" in by[("k", 2)]["placement_collapsed"]
    table = format_table(rows)
    assert "per_device" in table and "keras-mxnet maps cpu(i) to cpu(0)" in table


def test_intervals_none_for_one_range_for_two_ci_from_three() -> None:
    """One rule: 1 repeat has no interval, 2 their range (named so, bounds min and max),
    3 or more the bootstrap CI, named with its method; the speedup's by the side with fewer."""
    assert median_interval([100.0]) == (None, None, NO_INTERVAL)
    assert median_interval([104.0, 96.0]) == (96.0, 104.0, RANGE)
    low, high, kind = median_interval([96.0, 100.0, 104.0])
    assert kind == BOOTSTRAP_CI == "95% bootstrap CI" and 96.0 <= low <= high <= 104.0
    assert interval_name(RANGE) == "range (2 repeats)" and interval_name(NO_INTERVAL) == ""
    assert "percentile bootstrap" in interval_notes([BOOTSTRAP_CI])[0]
    assert ratio_interval([180.0, 200.0], [90.0, 100.0]) == (1.8, 200.0 / 90.0, RANGE)
    assert ratio_interval([180.0, 200.0, 190.0], [100.0, 90.0])[2] == RANGE
    assert ratio_interval([180.0], [90.0, 100.0]) == (None, None, NO_INTERVAL)

    rows = {r["num_devices"]: r for r in summarise(
        [summary_row(1, v, repeat=i) for i, v in enumerate([100.0, 90.0])]
        + [summary_row(2, v, repeat=i) for i, v in enumerate([180.0, 200.0, 190.0])]
        + [summary_row(4, 300.0)])}
    assert rows[1]["interval"] == RANGE
    assert (rows[1]["images_per_sec_ci_low"], rows[1]["images_per_sec_ci_high"]) == (90.0, 100.0)
    assert rows[2]["interval"] == BOOTSTRAP_CI and rows[2]["speedup_interval"] == RANGE
    assert rows[4]["interval"] == NO_INTERVAL and rows[4]["images_per_sec_ci_low"] is None
    assert {"interval", "speedup_interval"} <= set(columns.keys("csv"))
