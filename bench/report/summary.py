"""Outputs of a sweep: summary.csv, the terminal table, and the charts (bench/report/charts.py)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from bench.analysis import findings
from bench.analysis.converge import converge_rows
from bench.analysis.gate import read_gate
from bench.analysis.stats import (
    BASELINE,
    CV_TARGET,
    PIPELINE_FIELDS,
    interval_notes,
    summarise,
    summarise_pipelines,
)
from bench.records import columns
from bench.records.grouping import runner_label
from bench.records.store import atomic_file, load_records
from bench.records.trust import doubts
from bench.report import allreduce as allreduce_report
from bench.report import capacity as capacity_report
from bench.report import converge as converge_report
from bench.report import strategies as strategy_report
from bench.report.charts import (
    render_charts,
    render_memory_chart,
    render_pipeline_chart,
    render_real_chart,
    render_tokens_chart,
)
from bench.report.html import sweep_config, write_html
from bench.report.junit import write_junit
from bench.report.markdown import write_markdown
from bench.report.telemetry_chart import render_telemetry_charts
from bench.text_table import aligned


def write_summary(results_dir: Path, rows: list[dict[str, Any]],
                  name: str = "summary.csv",
                  fields: tuple[str, ...] | None = None) -> Path:
    """Write rows as results_dir/name with these columns (default: summary.csv's, the csv
    view of bench/records/columns.py)."""
    fields = columns.keys("csv") if fields is None else fields
    path = Path(results_dir) / name
    with atomic_file(path, newline="") as fh:  # a full disk leaves the last good file
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row[k]) for k in fields})
    return path


def _fmt(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else ("" if value is None else value)


def format_table(rows: list[dict[str, Any]],
                 pipelines: list[dict[str, Any]] | None = None,
                 allreduce: str | None = None, strategies: str | None = None,
                 capacity: str | None = None, converge: str | None = None) -> str:
    """The summary (and the strategy tables (bench/report/strategies.py), the pipeline-mode
    summary, the all-reduce probe's table (bench/report/allreduce.py) and the capacity table
    (bench/report/capacity.py), if any) as fixed-width text tables."""
    parts = [_benchmark_table(rows)] if rows or not (pipelines or allreduce or capacity) \
        else []
    if strategies:
        parts.append(strategies)
    if pipelines:
        parts.append(_pipeline_table(pipelines))
    if allreduce:
        parts.append(allreduce)
    if capacity:
        parts.append(capacity)
    if converge:
        parts.append(converge)
    return "\n\n".join(parts)


def _pipeline_table(rows: list[dict[str, Any]]) -> str:
    lines = [("pipeline", "model", "size", "batch", "workers", "status", "img/s",
              "img/s/core", f"x {BASELINE}")]
    for r in rows:
        ips, core, vs = r["images_per_sec"], r["images_per_sec_per_core"], r["vs_baseline"]
        lines.append((
            r["pipeline"], r["model"], str(r["image_size"] or "-"), str(r["batch"]),
            str(r["loader_workers"]), r["status"],
            f"{ips:.1f}" if ips is not None else "-", f"{core:.1f}" if core is not None else "-",
            f"{vs:.2f}" if vs is not None else "-"))
    reasons = [f"  {r['pipeline']} {r['model']} workers={r['loader_workers']}: {r['reason']}"
               for r in rows if r["status"] != "ok" and r.get("reason")]
    return "\n".join(["Input pipelines alone (mode: pipeline):", *aligned(lines)]
                     + (["", "Not ok:", *reasons] if reasons else []))


def _benchmark_table(rows: list[dict[str, Any]]) -> str:
    """The summary's cells in the table view of the column registry (bench/records/columns.py), then
    the notes: placement, each flag that is on in some row, the reasons of rows not ok."""
    cells = columns.cells("table", rows)
    lines = [tuple(c.header for c in cells)]
    lines += [tuple(columns.cell(c, r, "table") for c in cells) for r in rows]
    out = aligned(lines)
    out += ["", "placed: devices the framework reports the timed steps ran on (the record's "
            "placement); BN: BatchNorm statistics per device or over the global batch"]
    for r in rows:
        if r.get("placement_collapsed"):
            out.append(f"  * {runner_label(r)} n={r['num_devices']}: {r['placement_collapsed']}")
    notes = interval_notes(r.get("interval") for r in rows)
    if notes:
        out += ["", "interval of img/s over repeats: " + "; ".join(notes)]
    for flag in columns.flags():
        if any(r.get(flag.key) for r in rows):
            out += ["", f"{flag.header}: {flag.meaning}"]
    out += flagged_lines(rows)
    reasons = [f"  {runner_label(r)} {r['model']} n={r['num_devices']}: {r['reason']}"
               for r in rows if r["status"] != "ok" and r.get("reason")]
    return "\n".join(out + (["", "Not ok:"] + reasons if reasons else []))


def flagged_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Under the table: each row with a flagged figure (bench.records.trust.doubts) and why,
    numbers included; none when no figure is flagged."""
    out = [f"  {runner_label(r)} {r['model']} n={r['num_devices']}: " + "; ".join(
        doubts(r).values()) for r in rows if doubts(r)]
    return ["", "Flagged figures (? in the table; not results):", *out] if out else []


def findings_text(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """The Findings the terminal prints before the table (bench/analysis/findings.py), as
    report.html opens with them; '' without benchmark rows."""
    return findings.text(rows, records)


def build_report(results_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                             list[Path]]:
    """Re-read a results folder's records; write summary.csv (and pipelines.csv,
    strategies.csv, allreduce.csv and capacity.csv), the charts, report.html and results.md.
    Returns the benchmark rows, the pipeline rows and the paths of the charts and the two
    reports."""
    records = load_records(results_dir)
    rows, pipes = summarise(records, cv_target(results_dir)), summarise_pipelines(records)
    write_summary(results_dir, rows)
    if pipes:
        write_summary(results_dir, pipes, "pipelines.csv", PIPELINE_FIELDS)
    compared = strategy_report.strategy_rows(records)
    if compared:
        write_summary(results_dir, compared, strategy_report.CSV_NAME, strategy_report.FIELDS)
    probes, link = allreduce_report.rows_and_link(results_dir, records)
    if probes:
        write_summary(results_dir, probes, allreduce_report.CSV_NAME,
                      allreduce_report.ALLREDUCE_FIELDS)
    searches = capacity_report.capacity_rows(results_dir)
    if searches:
        write_summary(results_dir, searches, capacity_report.CSV_NAME,
                      capacity_report.CAPACITY_FIELDS)
    charts = render_charts(results_dir, rows) if rows or not (pipes or probes or searches) \
        else []
    extra = [render_tokens_chart(results_dir, rows), render_memory_chart(results_dir, rows),
             render_real_chart(results_dir, rows), render_pipeline_chart(results_dir, pipes),
             allreduce_report.render_allreduce_chart(results_dir, probes, link)]
    charts += [c for c in extra if c]
    converged = converge_rows(records)
    if converged:
        converge_report.write_csv(results_dir, converged)
        charts += [c for c in [converge_report.draw_chart(records, results_dir / "charts")]
                   if c]
    telemetry = render_telemetry_charts(results_dir, records)
    charts.append(write_html(results_dir, rows, pipes, records, charts, telemetry))
    charts.append(write_markdown(results_dir, rows, records))
    write_junit(results_dir, records, read_gate(results_dir)[0])
    return rows, pipes, charts


def cv_target(results_dir: Path) -> float:
    """The sweep's until_stable.target_cv (from its config.yaml, read tolerantly:
    bench.report.html.sweep_config), else stats.CV_TARGET: a missing or unreadable file, or a
    target that is not a number in (0, 1], gives the default."""
    stable = (sweep_config(results_dir) or {}).get("until_stable")
    target = stable.get("target_cv") if isinstance(stable, dict) else None
    if isinstance(target, bool) or not isinstance(target, (int, float)) \
            or not 0 < target <= 1:  # NaN fails too
        return CV_TARGET
    return float(target)
