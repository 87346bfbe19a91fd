"""report.html: one page a person can open from a results folder: the machine, the summary
with its intervals and flags, the runs that need a second look and why, the charts, and
every run's telemetry chart and log."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from bench.analysis.converge import converge_rows
from bench.analysis.explain import html_section as where_the_time_went
from bench.analysis.published import published_section
from bench.records import columns
from bench.records.grouping import runner_label
from bench.records.store import folder_damage, read_environment, write_text_atomic
from bench.report.allreduce import html_section as allreduce_section
from bench.report.capacity import html_section as capacity_section
from bench.report.converge import CHART_NAME as CONVERGE_CHART
from bench.report.converge import html_section as converge_section
from bench.report.strategies import html_section as strategies_section

# The per-run columns the Runs table shows beside the run's id, status and files.
RUN_CELLS = ("images_per_sec", "tokens_per_sec", "memory_peak_bytes", "gpu_util_pct",
             "run_cpu_cores", "joules_per_image", "mfu")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _flags(row: dict[str, Any]) -> list[str]:
    """The keys of the flag columns (bench/records/columns.py) that are on in a summary row."""
    return [c.key for c in columns.flags_on(row)]


def _summary(rows: list[dict[str, Any]]) -> str:
    """The summary's cells in the html view of the column registry (bench/records/columns.py)."""
    cells = columns.cells("html", rows)
    out = [[_cell(c, r) for c in cells] for r in rows]
    table = _table([c.header for c in cells], out)
    notes = [f"<li>* {_e(runner_label(r))} n={r['num_devices']}: {_e(r['placement_collapsed'])}"
             "</li>" for r in rows if r.get("placement_collapsed")]
    return table + (f"<ul>{''.join(notes)}</ul>" if notes else "")


def _cell(col: columns.Column, row: dict[str, Any]) -> str:
    text = _e(columns.cell(col, row, "html"))
    return f"<b>{text}</b>" if col.format == "flags" else text


def _flagged(rows: list[dict[str, Any]]) -> str:
    items = [f"<li><b>{_e(runner_label(r))} {_e(r['model'])} n={r['num_devices']} "
             f"{_e(r['data_label'])} {_e(r['precision'])}</b>: "
             + "; ".join(f"<i>{c.key}</i>: {_e(c.meaning)}" for c in columns.flags_on(r))
             + "</li>"
             for r in rows if _flags(r)]
    return f"<ul>{''.join(items)}</ul>" if items else "<p>No row is flagged.</p>"


def _runs(results_dir: Path, records: list[dict[str, Any]], telemetry: set[str]) -> str:
    out = []
    # an optional column (tokens/sec, memory) only where some run has it
    cells = [c for c in map(columns.column, RUN_CELLS) if not c.optional
             or any(columns.run_value(c, r) is not None for r in records)]
    for rec in sorted(records, key=lambda r: r["run_id"]):
        tel = rec.get("telemetry") or {}
        chart = f"charts/telemetry/{rec['run_id']}.png"
        log = rec.get("log_path")
        log_rel = (f"runs/{Path(log).name}" if log and (Path(results_dir) / "runs" /
                                                          Path(log).name).exists() else None)
        out.append([
            _e(rec["run_id"]), _e(rec["status"]),
            *(_e(columns.cell(c, {c.key: columns.run_value(c, rec)}, "html")) for c in cells),
            _e(rec.get("reason") or tel.get("note") or ""),
            (f'<a href="{_e(chart)}">telemetry</a>' if rec["run_id"] in telemetry else "")
            + (f' <a href="{_e(log_rel)}">log</a>' if log_rel else ""),
        ])
    return _table(["run", "status", *(c.header for c in cells),
                   "reason / note", "files"], out)


def _environment(records: list[dict[str, Any]], results_dir: Path) -> str:
    env = read_environment(Path(results_dir))[0]  # None where missing or damaged
    if env is None:
        env = (records[0].get("environment") if records else None) or {}
    gpus = ", ".join(g.get("name", "?") for g in env.get("gpus") or []) or "none seen by NVML"
    topo = env.get("gpu_topology") or {}
    lines = [f"<li>host {_e(env.get('host'))}, {_e(env.get('os'))}</li>",
             f"<li>CPU {_e(env.get('cpu_model'))} x {_e(env.get('cpu_cores'))}, memory "
             f"{_num((env.get('memory_bytes') or 0) / 2**30, '.1f')} GiB</li>",
             f"<li>GPUs: {_e(gpus)}</li>",
             f"<li>harness commit {_e(env.get('harness_commit'))}</li>"]
    matrix = topo.get("nvidia_smi_topo_m")
    detail = (f"<pre>{_e(matrix)}</pre>" if matrix else
              f"<p>GPU topology: {_e(topo.get('reason') or 'not captured')}</p>")
    return f"<ul>{''.join(lines)}</ul>{detail}"


def _damaged(results_dir: Path) -> str:
    """The folder's damaged files (bench/records/store.py's tolerant reader), one line each:
    none of their numbers is in this report."""
    lines = folder_damage(results_dir)
    if not lines:
        return ""
    items = "".join(f"<li>{_e(d.line(results_dir))}</li>" for d in lines)
    return ("<h2>Damaged files</h2><p>These files could not be read as records; nothing of "
            f"them is in this report (`--resume` runs them again).</p><ul>{items}</ul>")


def write_html(results_dir: Path, rows: list[dict[str, Any]], pipes: list[dict[str, Any]],
               records: list[dict[str, Any]], charts: list[Path],
               telemetry_charts: list[Path]) -> Path:
    """Write results_dir/report.html and return its path."""
    results_dir = Path(results_dir)
    name = results_dir.name
    imgs = "".join(f'<p><img src="charts/{_e(c.name)}" alt="{_e(c.name)}"></p>'
                   for c in charts if c.suffix == ".png" and c.name != CONVERGE_CHART)
    virtual = any(r["virtual_devices"] for r in rows)
    parts = [
        f"<h1>Benchmark report: {_e(name)}</h1>",
        "<p><b>Virtual CPU devices:</b> multi-device rows ran on one host's cores; they show "
        "the harness and the strategies work, not GPU scaling.</p>" if virtual else "",
        _damaged(results_dir),
        "<h2>Machine</h2>", _environment(records, results_dir),
        "<h2>Summary</h2>",
        "<p>img/s is the median over repeats with a 95% bootstrap interval; speedup and "
        "efficiency are against the same configuration on 1 device. MFU is training FLOPs "
        "(3 x the model's forward FLOPs per image) x img/s over the device's measured matmul "
        "peak at the run's precision. mem/dev is the most memory one device held in the "
        "timed window, as its framework's allocator reports it (on CPU the rank's process's "
        "peak resident memory, shared by its virtual devices; the csv's memory_source says "
        "what was read), state the model state one device holds (parameters, gradients, "
        "optimizer); tok/s is a token model's samples/sec x its sequence length.</p>",
        _summary(rows) if rows else "<p>No benchmark runs.</p>",
        strategies_section(records),
        "<h2>Flagged</h2>", _flagged(rows),
        where_the_time_went(rows, records),
        allreduce_section(results_dir, records),
        capacity_section(results_dir),
        converge_section(converge_rows(records),
                         next((c for c in charts if c.name == CONVERGE_CHART), None)),
        "<h2>Charts</h2>", imgs,
        published_section([*rows, *pipes, *records]),
        "<h2>Runs</h2>", _runs(results_dir, records, {p.stem for p in telemetry_charts}),
    ]
    if pipes:
        at = parts.index("<h2>Charts</h2>")
        parts[at:at] = ["<h2>Input pipelines alone</h2>", _table(
            ["pipeline", "model", "batch", "workers", "status", "img/s", "img/s per core",
             "x pil_loop"],
            [[_e(p["pipeline"]), _e(p["model"]), _e(p["batch"]), _e(p["loader_workers"]),
              _e(p["status"]), _num(p["images_per_sec"], ".1f"),
              _num(p["images_per_sec_per_core"], ".1f"), _num(p["vs_baseline"], ".2f")]
             for p in pipes])]
    style = ("body{font-family:sans-serif;margin:2em;max-width:1400px}"
             "table{border-collapse:collapse;font-size:13px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
             "th{background:#eee}img{max-width:100%}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(name)}</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
    path = results_dir / "report.html"
    write_text_atomic(path, page)
    return path
