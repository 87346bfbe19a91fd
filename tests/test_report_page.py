"""report.html on its own and results.md, from a real sweep's records (tests/golden/
converge-results: 2 repeats on virtual CPU devices), some edited in a copy: the date, every
framework version, the settings, memory per device, the placement evidence, every image inline;
an empty folder and one with damaged files still get both. No framework runs here."""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from bench.records.store import load_records
from bench.report.html import gpus_line, sweep_span
from bench.report.markdown import NAME as RESULTS_MD
from bench.report.summary import build_report, format_table
from tests.helpers.cli import REPO

GOLDEN = REPO / "tests" / "golden" / "converge-results"
MEMORY = {"rank0:cpu": 3 * 2**30 // 2, "rank1:cpu": 2**30}
SOURCE = "the process's peak resident memory (VmHWM), read after the timed window"


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """A copy of the golden folder whose torch_ddp 2-device runs recorded memory per device."""
    out = tmp_path / "sweep"
    shutil.copytree(GOLDEN, out)
    for path in (out / "runs").glob("converge__torch_ddp__*__n2__*.json"):
        rec = json.loads(path.read_text())
        rec.update(memory_per_device=MEMORY, memory_source=SOURCE)
        path.write_text(json.dumps(rec))
    return out


def test_report_html_shows_date_versions_settings_and_memory(folder: Path) -> None:
    rows, _, paths = build_report(folder)
    records = load_records(folder)
    page = (folder / "report.html").read_text()
    first = min(datetime.fromisoformat(r["started_at"]) for r in records)
    assert f"<th>date</th><td>{first:%Y-%m-%d %H:%M:%S} to " in page
    versions = {v for r in records for v in r["environment"]["framework"].values()}
    assert versions and all(f"<td>{v}</td>" in page for v in versions)
    warmup = {r["warmup_steps"] for r in records}
    timed = {r["measure_steps"] for r in records}
    assert len(warmup) == len(timed) == 1
    assert f"<th>warm-up steps</th><td>{warmup.pop()}</td>" in page
    assert f"<th>timed steps</th><td>{timed.pop()}</td>" in page
    assert "<th>GPUs</th><td>no GPU: virtual CPU devices</td>" in page
    assert "<th>timeout</th><td>600 s per run (config.yaml)</td>" in page
    assert "weak scaling: the batch per device is fixed" in page
    # memory per device where recorded, with what was read
    assert "rank0:cpu 1.50 GiB, rank1:cpu 1.00 GiB" in page and SOURCE.replace(
        "'", "&#x27;") in page
    # the placement evidence: the devices the framework named, the work counts checked
    assert "2 of 2 devices: cpu:0, cpu:1; backward_convs_per_device" in page
    # one file: every image inline, nothing fetched
    images = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert len(images) >= 4 and all(s.startswith("data:image/png;base64,") for s in images)
    assert 'src="charts/' not in page and 'src="http' not in page
    assert "<link" not in page and "<script" not in page and "@import" not in page
    # 2 repeats: a range, called so
    assert "range (2 repeats): the lowest and highest" in page
    assert folder / RESULTS_MD in paths


def test_results_md_is_a_pasteable_summary(folder: Path) -> None:
    rows, _, _ = build_report(folder)
    text = (folder / RESULTS_MD).read_text()
    assert text.startswith("# Benchmark results: sweep\n")
    assert f"- Date: {sweep_span(load_records(folder))}" in text
    assert "| runner | model | devices |" in text and "\n|---|---|" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(rows)
    torch2 = next(line for line in table if line.startswith("| torch_ddp | small_cnn | 2 vcpu"))
    assert "range (2 repeats)" in torch2 and "1.50 GiB" in torch2
    assert "torch 2.13.0+cpu" in text and "tensorflow 2.21.0" in text
    assert "warm-up steps 5; timed steps 20" in text
    assert "**Virtual CPU devices:**" in text and "## Published figures beside" in text


def test_two_repeats_print_no_95_percent(folder: Path) -> None:
    """Every configuration has 2 repeats: the text table and results.md call the interval a
    range and never a 95% one."""
    rows, _, _ = build_report(folder)
    assert {r["interval"] for r in rows} == {"range"}
    assert "95%" not in format_table(rows)
    assert "95%" not in (folder / RESULTS_MD).read_text()


def test_an_empty_folder_gets_both(tmp_path: Path) -> None:
    build_report(tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "<th>date</th><td>no runs</td>" in page and "<p>No benchmark runs.</p>" in page
    text = (tmp_path / RESULTS_MD).read_text()
    assert "- Date: no runs" in text and "No benchmark runs." in text


def test_a_folder_with_damaged_files_gets_both(folder: Path) -> None:
    (folder / "runs" / "broken.json").write_text('{"run_id": ')
    (folder / "environment.json").write_text("[]")
    rows, _, _ = build_report(folder)
    page = (folder / "report.html").read_text()
    assert "<h2>Damaged files</h2>" in page and "runs/broken.json" in page
    # the machine from the records' own environment where environment.json is damaged
    assert "<th>CPU</th><td>AMD EPYC x 2 cores</td>" in page
    text = (folder / RESULTS_MD).read_text()
    assert "- Damaged files: 2" in text and len(rows) == 6


def test_gpus_are_named_with_their_count_and_driver() -> None:
    gpu = {"name": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15"}
    assert gpus_line({"gpus": [gpu, gpu]}, []) == "2 x NVIDIA H100 80GB HBM3 (driver 550.54.15)"
    assert gpus_line({"gpus": []}, [{"virtual_devices": False}]) == "none seen by NVML"
    assert gpus_line({}, []) == "not recorded"


def test_a_mailed_page_keeps_each_log_tail_and_names_the_whole_log(folder: Path) -> None:
    """Item 10 of issue 42: no relative log link (it breaks when report.html is mailed); the
    log's last lines are in the page, with the whole log's absolute path; a log not in the
    folder is said to be so, with the path the record gives."""
    run_id = "converge__torch_ddp__small_cnn__n2__b32__real-w0__fp32__r0"
    lines = [f"line {i} <of the log>" for i in range(100)] + ["Traceback: \x1b[31mboom & bust"]
    (folder / "runs" / f"{run_id}.log").write_text("\n".join(lines) + "\n")
    build_report(folder)
    page = (folder / "report.html").read_text()
    assert 'href="runs/' not in page
    page = page.split("<h2>Runs</h2>")[1]
    row = page.split(f"<td>{run_id}</td>")[1].split("</tr>")[0]
    assert "<pre>line 71 &lt;of the log&gt;\n" in row and "Traceback: [31mboom &amp; bust" in row
    assert "line 70 " not in row and "\x1b" not in page  # the tail: 30 lines, no control
    assert f"the whole log: {(folder / 'runs' / run_id).absolute()}.log" in row
    other = page.split("<td>converge__torch_ddp__small_cnn__n1__b32__real-w0__fp32__r1</td>")[1]
    assert ("log: not in this folder (recorded at /tmp/conv-all/runs/converge__torch_ddp__"
            "small_cnn__n1__b32__real-w0__fp32__r1.log)") in other.split("</tr>")[0]
