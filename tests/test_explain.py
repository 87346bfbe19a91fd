"""Where the time went (bench/analysis/explain.py): one line per summary row, from a hand-written
results folder, and its section in report.html."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.analysis import explain
from bench.analysis.predict import communication, probe_bandwidth
from bench.analysis.stats import summarise
from bench.records.store import load_records
from bench.report.html import write_html
from contract.collectives import gradient_bytes
from tests.helpers.records import gpu_record, probe_record, write_folder

RESNET = gradient_bytes("resnet50")


def _ms(text: str, term: str) -> float:
    """The milliseconds a line gives a term ('compute 320 ms', 'communication up to 13 ms')."""
    match = re.search(rf"{term} (?:up to )?(-?[\d.]+) ms", text)
    assert match, (term, text)
    return float(match[1])


def lines_of(folder: Path) -> dict[tuple[str, int], str]:
    records = load_records(folder)
    rows = summarise([r for r in records if r.get("mode") == "benchmark"])
    out = explain.explain(rows, records)
    return {(r["data_label"], r["num_devices"]): line
            for r, line in zip([r for r in rows if r["mode"] == "benchmark"], out, strict=True)}


def test_a_row_splits_its_step_into_compute_communication_and_the_rest(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, 360.0),
                                           probe_record("torch_allreduce", "torch", 2, 5.0)])
    line = lines_of(folder)[("synthetic", 2)]
    step, compute = 128 / 360.0, 64 / 200.0
    comm = communication(RESNET, 2, probe_bandwidth(
        [probe_record("torch_allreduce", "torch", 2, 5.0)], "torch_ddp", "gpu", 2, RESNET))[0]
    assert _ms(line, "step") == pytest.approx(step * 1e3, rel=1e-2)
    assert _ms(line, "compute") == pytest.approx(compute * 1e3, rel=1e-2)
    assert _ms(line, "communication") == pytest.approx(comm * 1e3, rel=1e-2)
    assert _ms(line, "unexplained") == pytest.approx((step - compute - comm) * 1e3, rel=2e-2)
    assert "probe torch_allreduce" in line
    assert "GPUs idle 20%" in line  # telemetry: 80% mean utilisation
    assert "input 0 (synthetic data)" in line


def test_without_a_probe_the_line_says_so_and_leaves_communication_in_the_rest(
        tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, 360.0)])
    line = lines_of(folder)[("synthetic", 2)]
    assert "no probe in this sweep" in line
    assert _ms(line, "unexplained") == pytest.approx((128 / 360 - 64 / 200) * 1e3, rel=2e-2)


def test_real_data_costs_its_time_beyond_the_synthetic_twin(tmp_path: Path) -> None:
    real = {"data": "real", "dataset": {"path": "/d", "augmentation": "none", "workers": 2}}
    folder = write_folder(tmp_path / "r", [
        gpu_record(1, 200.0), gpu_record(1, 150.0, **real)])
    line = lines_of(folder)[("real-w2", 1)]
    step = 64 / 150.0
    assert _ms(line, "input") == pytest.approx(step * (1 - 150 / 200) * 1e3, rel=1e-2)
    assert "real data at 75% of synthetic" in line
    # compute is the synthetic twin's step, which has no input in it: nothing left over
    assert _ms(line, "compute") == pytest.approx(64 / 200 * 1e3, rel=1e-2)
    assert "on synthetic data" in line and "unexplained 0 ms" in line


def test_a_row_without_an_ok_run_says_why(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, None)])
    assert "not measured (failed: boom)" in lines_of(folder)[("synthetic", 2)]


def test_cpu_rows_give_busy_cores_instead_of_gpu_idle(tmp_path: Path) -> None:
    cpu = {"device": "cpu", "virtual_devices": True,
           "telemetry": {"gpu_util_mean_pct": None, "host": {"run_cpu_cores_mean": 1.5}}}
    folder = write_folder(tmp_path / "r", [gpu_record(1, 20.0, **cpu), gpu_record(2, 12.0, **cpu)])
    line = lines_of(folder)[("synthetic", 2)]
    assert "kept 1.5 CPU cores busy" in line and "GPUs idle" not in line
    assert "virtual devices share the host's cores" in line


def test_report_html_has_the_section(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, 360.0)])
    records = load_records(folder)
    rows = summarise(records)
    page = write_html(folder, rows, [], records, [], []).read_text()
    assert f"<h2>{explain.HEADING}</h2>" in page
    assert "torch_ddp resnet50 synthetic fp32 b=64/dev, 2 gpu: step" in page
