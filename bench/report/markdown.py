"""results.md: a short Markdown summary of a results folder, fit to paste into an issue or a
paper: when and where it ran, the framework versions, the settings in a line, the summary as a
Markdown table (img/s with its interval named, speedup, efficiency, memory per device,
status), the published figures beside, and the virtual-devices caveat where it applies.
Written beside report.html by the same build step (bench/report/summary.py build_report), from
the same facts (bench/report/html.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.analysis.compare import frameworks
from bench.analysis.gate import read_gate
from bench.analysis.published import load_published, select
from bench.analysis.stats import interval_name, interval_notes
from bench.atomic import write_text_atomic
from bench.records import columns
from bench.records.grouping import data_label, runner_label
from bench.records.store import folder_damage
from bench.records.trust import doubts
from bench.report.html import VIRTUAL_CAVEAT, machine, sweep_config, sweep_settings, sweep_span

NAME = "results.md"


def _md(text: Any) -> str:
    """Text for a Markdown table cell: | escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _row(cells: list[Any]) -> str:
    return "| " + " | ".join(_md(c) for c in cells) + " |"


def _table(head: list[str], body: list[list[Any]]) -> list[str]:
    return [_row(head), "|" + "---|" * len(head), *(_row(r) for r in body)]


def _cell(key: str, row: dict[str, Any]) -> str:
    return columns.cell(columns.column(key), row, "table")


def _interval(row: dict[str, Any]) -> str:
    low, high = row.get("images_per_sec_ci_low"), row.get("images_per_sec_ci_high")
    name = interval_name(row.get("interval"))
    return f"{low:.1f}-{high:.1f} {name}" if name and low is not None and high is not None \
        else "-"


def summary_table(rows: list[dict[str, Any]]) -> list[str]:
    """The summary rows as a Markdown table: img/s (median) with its interval named,
    speedup, efficiency, memory per device and status."""
    body = [[runner_label(r), r["model"], _cell("num_devices", r),
             _cell("batch_size_per_device", r), r["precision"], data_label(r),
             _cell("images_per_sec", r), _interval(r), _cell("speedup", r),
             _cell("scaling_efficiency", r), _cell("memory_peak_bytes", r), _cell("status", r)]
            for r in rows]
    return _table(["runner", "model", "devices", "batch", "prec", "data", "img/s (median)",
                   "interval", "speedup", "efficiency", "mem/dev", "status"], body)


def flagged(rows: list[dict[str, Any]]) -> list[str]:
    """Each row with a flagged figure (marked ? or (baseline contended) in the table) and
    why, as a list under a heading; none when nothing is flagged."""
    items = [f"- **{_md(runner_label(r))} {_md(r['model'])} n={r['num_devices']}**: "
             + "; ".join(_md(why) for why in doubts(r).values()) for r in rows if doubts(r)]
    return ["## Flagged figures (not results)", "", *items, ""] if items else []


def published_table(rows: list[dict[str, Any]]) -> list[str]:
    """The published figures (reference/published.csv) of the sweep's models at the device
    counts it ran, beside the measured ones; a line saying so where there is none."""
    ran = {(r["model"], r["num_devices"]) for r in rows}
    found = [p for p in select(load_published(), {m for m, _ in ran})
             if (p["model"], p["gpus"]) in ran]
    if not found:
        return ["No published figure for these models at these device counts "
                "(reference/published.csv)."]
    body = [[p["model"], p["system"], p["hardware"], p["gpus"], p["batch_per_gpu"] or "-",
             p["precision"], p["data"], "-" if p["images_per_sec"] is None
             else f"{p['images_per_sec']:,}", "-" if p["scaling_efficiency"] is None
             else f"{p['scaling_efficiency']:.0%}",
             f"[{p['source_short']}]({p['url']})" if p.get("url") else p["source_short"]]
            for p in found]
    return _table(["model", "system", "hardware", "GPUs", "batch/GPU", "precision", "data",
                   "images/sec", "efficiency", "source"], body)


def markdown(results_dir: Path, rows: list[dict[str, Any]],
             records: list[dict[str, Any]]) -> str:
    """results.md's text."""
    facts = dict(machine(records, results_dir))
    versions = "; ".join(f"{fam}: " + ", ".join(f"{pkg} {ver}" for pkg, ver in sorted(pkgs.items()))
                         for fam, pkgs in sorted(frameworks(records).items())) or "none reported"
    settings = "; ".join(f"{k} {v}" for k, v in
                         sweep_settings(records, rows, sweep_config(results_dir))) or "no runs"
    damaged = len(folder_damage(results_dir))
    out = [f"# Benchmark results: {Path(results_dir).resolve().name}", "",
           f"- Date: {sweep_span(records)}",
           f"- Host: {facts['host']}; CPU: {facts['CPU']}; GPUs: {facts['GPUs']}",
           f"- Versions: {versions}",
           f"- Harness commit: {facts['harness commit']}",
           f"- Settings: {settings}"]
    if damaged:
        out.append(f"- Damaged files: {damaged}, none of their numbers here (report.html names "
                   "them)")
    out.append("")
    if any(r.get("virtual_devices") for r in rows):
        out += [f"> **Virtual CPU devices:** {VIRTUAL_CAVEAT}", ""]
    if rows:
        out += summary_table(rows) + [""]
        notes = interval_notes(r.get("interval") for r in rows)
        out += [f"Intervals over repeats: {'; '.join(notes)}." if notes else
                "No interval: one run per configuration.", "",
                "Speedup and efficiency are against the same configuration on 1 device; "
                "mem/dev is the most memory one device held in the timed window.", ""]
        out += flagged(rows)
    else:
        out += ["No benchmark runs.", ""]
    out += ["## Published figures beside", "", *published_table(rows), ""]
    outcome, comparison = read_gate(results_dir)
    if outcome:
        out += ["## Against the baseline", "", f"**{outcome.get('line')}**", ""]
        out += [comparison, ""] if comparison else []
    return "\n".join(out)


def write_markdown(results_dir: Path, rows: list[dict[str, Any]],
                   records: list[dict[str, Any]]) -> Path:
    """Write results_dir/results.md (atomically) and return its path."""
    path = Path(results_dir) / NAME
    write_text_atomic(path, markdown(results_dir, rows, records))
    return path
