"""The column registry (bench/records/columns.py): one entry per column drives summary.csv, the
terminal table, report.html, the loader and results/README.md (issue 15: adding a metric is
the registry plus the code that computes it)."""

from __future__ import annotations

import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.analysis.loader import load_results
from bench.analysis.stats import INPUT_BOUND_RATIO, summarise
from bench.plan.config import validate
from bench.plan.runs import RunSpec, expand
from bench.records import columns
from bench.records import store as records
from bench.records.columns import Column
from bench.records.store import record_path, write_json_atomic
from bench.report.summary import build_report, format_table
from bench.run.launch import base_record
from bench.run.verdict import CHILD_FIELDS
from tests.helpers.cli import REPO
from tests.helpers.records import ENV, run_record


def write(out: Path, recs: list[dict]) -> Path:
    for rec in recs:
        write_json_atomic(record_path(out, rec["run_id"]), rec)
    return out


def csv_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_results_readme_is_generated_from_the_registry() -> None:
    """results/README.md's column tables are the registry's: run
    `python -m bench.records.columns --markdown` after changing bench/records/columns.py."""
    text = columns.README.read_text()
    assert columns.BEGIN in text and columns.END in text
    assert columns.with_markdown(text) == text, \
        "results/README.md is out of date: python -m bench.records.columns --markdown"
    for col in columns.COLUMNS:
        assert f"| `{col.key}` |" in text


def test_check_and_markdown_commands(tmp_path: Path) -> None:
    stale = tmp_path / "README.md"
    stale.write_text(f"# x\n\n{columns.BEGIN}\nold table\n{columns.END}\n\nafter\n")
    assert columns.main(["--check", str(stale)]) == 1
    proc = subprocess.run([sys.executable, "-m", "bench.records.columns", "--markdown", str(stale)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = stale.read_text()
    assert "old table" not in text and text.endswith(f"{columns.END}\n\nafter\n")
    assert "| `speedup` | speedup |" in text
    assert columns.main(["--check", str(stale)]) == 0


def test_registry_is_well_formed() -> None:
    keys = [c.key for c in columns.COLUMNS]
    assert len(keys) == len(set(keys)), "a key twice"
    for col in columns.COLUMNS:
        assert col.views and set(col.views) <= set(columns.VIEWS), col
        assert col.format in columns.FORMATS, col
        assert col.meaning.strip(), col
        assert col.over_runs is None or callable(col.over_runs) or \
            col.over_runs in {*columns.AGGREGATES, "config"}, col
        if set(col.views) & set(columns.DISPLAY_VIEWS):
            assert col.header, f"{col.key} is shown in a table without a header"
        if col.over_runs is not None:
            assert "csv" in col.views, f"{col.key} is combined over runs but not in summary.csv"
    # the flags cell lists the flags shown in the tables; a flag outside them shows elsewhere
    assert "flags" in columns.keys("table") and "flags" in columns.keys("html")
    assert f"{INPUT_BOUND_RATIO:.0%}" in columns.column("input_bound").meaning


def test_record_fields_are_the_registry_s_and_launch_writes_them(tmp_path: Path) -> None:
    """records.REQUIRED is the record view; bench.run.launch's CHILD_FIELDS is the child view,
    the spec view names RunSpec fields, and base_record writes every field of all three."""
    assert columns.keys("record") == records.REQUIRED
    assert set(CHILD_FIELDS) == set(columns.keys("child"))
    assert set(columns.keys("spec")) <= {f.name for f in dataclasses.fields(RunSpec)}
    cfg = validate({"runners": ["tf_mirrored"], "models": ["minigooglenet"], "devices": [1],
                    "batch_size_per_device": 8})
    rec = base_record(expand(cfg, "s")[0], ENV, tmp_path / "x.log")
    want = {*columns.keys("record"), *columns.keys("spec"), *columns.keys("child")}
    assert want <= set(rec), want - set(rec)


def test_every_view_follows_the_registry(tmp_path: Path) -> None:
    out = write(tmp_path / "sweep", [run_record(1, 0, 100.0), run_record(2, 0, 180.0)])
    rows, _, _ = build_report(out)
    fields, _ = csv_rows(out / "summary.csv")
    assert tuple(fields) == columns.keys("csv")
    head = format_table(rows).splitlines()[0].split("  ")
    assert [h.strip() for h in head if h.strip()] == [c.header for c in columns.cells("table",
                                                                                       rows)]
    page = (out / "report.html").read_text()
    core, details = columns.core_and_details(rows)  # the core table, then the details table
    assert set(core) | set(details) == set(columns.cells("html", rows))
    assert '<table class="core"><tr>' + "".join(f"<th>{c.header}</th>" for c in core) in page
    assert "".join(f"<th>{c.header}</th>" for c in (*core[:3], *details)) in page
    df = load_results(out)
    assert set(columns.keys("loader")) <= set(df.columns)


def table_records() -> list[dict]:
    """Two configurations (synthetic, real data) at 1 and 2 devices: repeats, a failed
    repeat, placement, BatchNorm, MFU and three flags."""
    real = {"data": "real", "dataset": {"workers": 2}, "data_label": "real-w2"}
    return [
        {**run_record(1, 0, 100.0), "placement": {"c0": 1}, "result": {"batchnorm": "global"},
         "mfu": {"mfu": 0.3}},
        run_record(1, 1, 104.0),
        {**run_record(2, 0, 180.0), "placement": {"c0": 2},
         "result": {"placement_collapsed": "one device"}, "telemetry": {"starved": True}},
        {**run_record(2, 1, 1.0), "status": "oom", "reason": "out of memory",
         "images_per_sec": None, "step_times_s": None},
        {**run_record(1, 0, 90.0), **real},
        {**run_record(2, 0, 100.0), **real, "contended": True},
    ]


# format_table's output for table_records() before the registry (commit e1f71b0), its interval
# named since issue 30 (2 repeats: a range, not a 95% CI)
TABLE_BEFORE = (
    'runner       model          devices  placed  BN      batch   prec  data       st'
    'atus    img/s  interval           speedup  effic.  real/syn          MFU    flag'
    's\n'
    '-----------  -------------  -------  ------  ------  ------  ----  ---------  --'
    '------  -----  -----------------  -------  ------  ----------------  -----  ----'
    '-----\n'
    'tf_mirrored  minigooglenet  1 vcpu   -       -       32/dev  fp32  real-w2    ok'
    '        90.0   -                  1.00x    100%    0.88 INPUT-BOUND  -      -\n'
    'tf_mirrored  minigooglenet  2 vcpu   -       -       32/dev  fp32  real-w2    ok'
    '        100.0  -                  1.11x    56%     0.56 INPUT-BOUND  -      CONT'
    'ENDED\n'
    'tf_mirrored  minigooglenet  1 vcpu   1       global  32/dev  fp32  synthetic  ok'
    ' (2/2)  102.0  range 100.0-104.0  1.00x    100%    -                 30.0%  -\n'
    'tf_mirrored  minigooglenet  2 vcpu   1*      -       32/dev  fp32  synthetic  ok'
    ' (1/2)  180.0  -                  1.76x    88%     -                 -      STAR'
    'VED\n'
    '\n'
    "placed: devices the framework reports the timed steps ran on (the record's place"
    'ment); BN: BatchNorm statistics per device or over the global batch\n'
    '  * tf_mirrored n=2: one device\n'
    '\n'
    'interval of img/s over repeats: range (2 repeats): the lowest and highest of two'
    ' repeats; too few for a confidence interval\n'
    '\n'
    "STARVED: the GPUs' mean utilisation in the timed window was below the threshold "
    "(telemetry.starved_below_pct) and no host thread was busy throughout: input or sync"
    'hronisation starves them\n'
    '\n'
    "CONTENDED: other processes used more than a quarter of the machine's CPUs in a r"
    "un's timed window, or held its GPUs; the record's telemetry.contention names the"
    'm (docs/RELIABILITY.md)\n'
    '\n'
    'INPUT-BOUND: real data below 90% of the same run on synthetic data (the input pi'
    'peline sets the pace)\n'
)


def test_terminal_table_is_unchanged() -> None:
    """The registry reproduces the terminal table as it was before it, byte for byte."""
    assert format_table(summarise(table_records())) + "\n" == TABLE_BEFORE


LOSS_DROP = Column("loss_drop", "loss drop", "3f", "How far the loss fell over the timed "
                   "window: first loss less last, the median over ok runs.",
                   run=lambda rec: (rec["first_loss"] - rec["last_loss"]
                                    if rec.get("first_loss") is not None else None),
                   over_runs="median")
DIVERGED = Column("diverged", "DIVERGED", "flag", "the loss rose over the timed window",
                  run=lambda rec: rec["last_loss"] > rec["first_loss"], over_runs="any")


def test_adding_a_metric_is_one_registry_entry(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A new column, given only as a registry entry with its computation (a reader of the
    record and how the runs combine), is in summary.csv, the terminal table, report.html,
    the loader's DataFrame and results/README.md's tables; a new flag is in the flags cell
    and explained under the table and in report.html."""
    at = columns.keys("csv").index("mfu")
    extra = (*columns.COLUMNS[:at], LOSS_DROP, *columns.COLUMNS[at:], DIVERGED)
    monkeypatch.setattr(columns, "COLUMNS", extra)
    out = write(tmp_path / "sweep", [
        run_record(1, 0, 100.0, 2.5, 2.25), run_record(1, 1, 102.0, 2.5, 2.0),
        run_record(1, 2, 98.0, 2.5, 2.125),  # drops 0.25, 0.5, 0.375: median 0.375
        run_record(2, 0, 180.0, 2.0, 2.5)])  # rose: diverged
    rows, _, _ = build_report(out)

    fields, csv_data = csv_rows(out / "summary.csv")
    assert fields.index("loss_drop") == fields.index("mfu") - 1 and fields[-1] == "diverged"
    by_n = {r["num_devices"]: r for r in csv_data}
    assert by_n["1"]["loss_drop"] == "0.375" and by_n["2"]["loss_drop"] == "-0.5"
    assert by_n["1"]["diverged"] == "False" and by_n["2"]["diverged"] == "True"

    table = format_table(rows)
    lines = table.splitlines()
    assert "loss drop" in lines[0] and lines[0].index("loss drop") < lines[0].index("MFU")
    assert "0.375" in lines[2] and "-0.500" in lines[3]
    assert lines[3].rstrip().endswith("DIVERGED") and "DIVERGED" not in lines[2]
    assert "DIVERGED: the loss rose over the timed window" in table

    page = (out / "report.html").read_text()
    assert "<th>loss drop</th>" in page and "<td>0.375</td>" in page
    assert "<b>DIVERGED</b>" in page
    assert "<i>diverged</i>: the loss rose over the timed window" in page

    df = load_results(out).set_index("repeat")
    one = df[df["num_devices"] == 1]["loss_drop"].sort_index().tolist()
    assert one == [0.25, 0.5, 0.375]
    assert df[df["num_devices"] == 2]["diverged"].tolist() == [True]

    doc = columns.markdown()
    assert "| `loss_drop` | loss drop | 3 decimals |" in doc and "| `diverged` |" in doc


def test_summary_combines_runs_as_the_registry_says() -> None:
    """over_runs: the configuration's own value, the median, any, min and first of the ok
    runs; a failed run's telemetry is left out."""
    a = {**run_record(2, 0, 100.0), "telemetry": {"gpu_util_mean_pct": 50.0, "starved": False},
         "placement": {"d0": 1, "d1": 1}, "result": {"batchnorm": "global"}}
    b = {**run_record(2, 1, 110.0), "telemetry": {"gpu_util_mean_pct": 70.0, "starved": True},
         "placement": {"d0": 1}, "result": {}}
    bad = {**run_record(2, 2, 1.0), "status": "failed", "reason": "boom", "images_per_sec": None,
           "telemetry": {"gpu_util_mean_pct": 1000.0, "starved": False}}
    row = summarise([a, b, bad])[0]
    assert row["runner"] == "tf_mirrored" and row["num_devices"] == 2
    assert row["gpu_util_pct"] == 60.0 and row["starved"] is True
    assert row["placed_devices"] == 1 and row["batchnorm"] == "global"
    assert row["contended"] is None and row["mfu"] is None  # no run said
    assert row["reason"] == "boom"


def test_loader_reads_runs_with_the_registry_s_readers(tmp_path: Path) -> None:
    rec = {**run_record(1, 0, 100.0), "placement": {"cpu:0": 3}, "contended": True,
           "telemetry": {"gpu_util_mean_pct": 42.0, "energy_j": 9.0,
                         "gpus": [{"mem_used_peak_bytes": 7}, {"mem_used_peak_bytes": 9}]},
           "mfu": {"mfu": 0.25, "peak_flops": 1e12}}
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "runs").mkdir()
    (out / "runs" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    row = load_results(out).iloc[0]
    assert row["placed_devices"] == 1 and row["contended"]
    assert row["gpu_util_pct"] == 42.0 and row["energy_j"] == 9.0
    assert row["gpu_mem_peak_bytes"] == 9 and row["mfu"] == 0.25
    assert row["step_time_median_s"] == pytest.approx(0.32)
    empty = load_results(tmp_path / "none")
    assert list(empty.columns[:len(columns.keys("loader"))]) == list(columns.keys("loader"))
