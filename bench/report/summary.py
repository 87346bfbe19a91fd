"""Outputs of a sweep: summary.csv, the terminal table, and the charts (matplotlib, PNG)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.analysis.converge import converge_rows
from bench.analysis.published import draw_published
from bench.analysis.stats import (
    BASELINE,
    CV_TARGET,
    INPUT_BOUND_RATIO,
    PIPELINE_FIELDS,
    interval_notes,
    summarise,
    summarise_pipelines,
)
from bench.plotting import pyplot, save
from bench.records import columns
from bench.records.grouping import runner_label
from bench.records.store import atomic_file, load_records
from bench.report import allreduce as allreduce_report
from bench.report import capacity as capacity_report
from bench.report import converge as converge_report
from bench.report import strategies as strategy_report
from bench.report.html import sweep_config, write_html
from bench.report.markdown import write_markdown
from bench.report.telemetry_chart import render_telemetry_charts
from bench.text_table import aligned

CHARTS = ("throughput.png", "efficiency.png", "largest_device_count.png")
REAL_CHART, PIPELINE_CHART = "real_vs_synthetic.png", "pipelines.png"
MEMORY_CHART, TOKENS_CHART = "memory_per_device.png", "tokens_per_sec.png"


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
    reasons = [f"  {runner_label(r)} {r['model']} n={r['num_devices']}: {r['reason']}"
               for r in rows if r["status"] != "ok" and r.get("reason")]
    return "\n".join(out + (["", "Not ok:"] + reasons if reasons else []))


def _series_label(row: dict[str, Any]) -> str:
    batch = (f"{row['batch_size_per_device']}/dev" if row["scaling"] == "weak"
             else f"{row['global_batch_size']} global")
    tag = " [virtual CPU devices]" if row["virtual_devices"] else ""
    data = "" if row["data_label"] == "synthetic" else f" {row['data_label']}"
    return f"{runner_label(row)} {row['precision']} b={batch}{data}{tag}"


def _series_labels(row: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The lines a row is a point of. Without multi-node rows: its configuration's line. With
    them: the configuration on one node (its 1-node rows, over devices), and across nodes at
    a fixed number of devices per node (the rows of that per-node count, 1 node included),
    each point at its total device count."""
    label = _series_label(row)
    if not any((r.get("num_nodes") or 1) > 1 for r in rows):
        return [label]
    nodes = row.get("num_nodes") or 1
    per_node = row["num_devices"] // nodes
    spans = any((r.get("num_nodes") or 1) > 1 and r["num_devices"] // r["num_nodes"] == per_node
                and _series_label(r) == label for r in rows)
    labels = [f"{label} 1 node"] if nodes == 1 else []
    return labels + ([f"{label} {per_node}/node x nodes"] if spans else [])


def render_charts(results_dir: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Throughput with the ideal line, efficiency, and all runners at the largest count."""
    plt = pyplot()

    out = Path(results_dir) / "charts"
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if r["images_per_sec"] is not None]
    models = sorted({r["model"] for r in ok}) or ["(no ok runs)"]
    virtual = any(r["virtual_devices"] for r in ok)
    note = " (virtual CPU devices: not GPU scaling)" if virtual else ""
    series: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        for label in _series_labels(r, ok):
            series[(r["model"], label)].append(r)
    paths = []

    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        for label, pts, line in _device_series(ax, series, model, "images_per_sec",
                                               "images_per_sec_ci_low",
                                               "images_per_sec_ci_high"):
            xs = [p["num_devices"] for p in pts]
            base = next((p for p in pts if p["num_devices"] == 1), None)
            if base is not None:
                ax.plot(xs, [base["images_per_sec"] * x for x in xs], "--",
                        color=line.get_color(), alpha=0.5, label=f"ideal ({label.split()[0]})")
        _device_axes(ax, model, "images/sec", ok)
        # published figures beside: log y (bench/analysis/published.py)
        draw_published(ax, model, ok)
    fig.suptitle("Throughput vs device count" + note)
    paths.append(save(fig, out / CHARTS[0], plt))

    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        ax.axhline(1.0, color="grey", linestyle="--", label="ideal (100%)")
        _device_series(ax, series, model, "scaling_efficiency", "efficiency_ci_low",
                       "efficiency_ci_high")
        _device_axes(ax, model, "scaling efficiency", ok)
        draw_published(ax, model, ok, "scaling_efficiency")
    fig.suptitle("Scaling efficiency (speedup / devices)" + note)
    paths.append(save(fig, out / CHARTS[1], plt))

    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        mine = [r for r in ok if r["model"] == model]
        top = max((r["num_devices"] for r in mine), default=0)
        bars = [r for r in mine if r["num_devices"] == top]
        drawn = ax.bar(range(len(bars)), [r["images_per_sec"] for r in bars])
        ax.bar_label(drawn, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(bars)), [_series_label(r).replace(" [virtual CPU devices]", "")
                                         for r in bars], rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{model}: {top} {'virtual CPU ' if virtual else ''}devices")
        ax.set_ylabel("images/sec")
    fig.suptitle("All runners at the largest device count" + note)
    paths.append(save(fig, out / CHARTS[2], plt))
    return paths


def _device_axes(ax: Any, model: str, ylabel: str, ok: list[dict[str, Any]]) -> None:
    """A device-count chart's axes: titles, a tick per device count run, y from zero."""
    _axes(ax, model, "devices", ylabel)
    _device_ticks(ax, [r for r in ok if r["model"] == model])
    ax.set_ylim(bottom=0)


def _device_series(ax: Any, series: dict[tuple[str, str], list[dict[str, Any]]], model: str,
                   key: str, low: str, high: str) -> list[tuple[str, list[dict[str, Any]], Any]]:
    """Draw each series of `model` that has `key` against the device count, with its
    confidence interval; (label, its points by device count, its line) of each."""
    drawn = []
    for (m, label), pts in sorted(series.items()):
        pts = sorted((p for p in pts if p[key] is not None), key=lambda r: r["num_devices"])
        if m != model or not pts:
            continue
        xs = [p["num_devices"] for p in pts]
        line, = ax.plot(xs, [p[key] for p in pts], "o-", label=label)
        _error_bars(ax, xs, pts, key, low, high, line.get_color())
        drawn.append((label, pts, line))
    return drawn


def _error_bars(ax: Any, xs: list[int], pts: list[dict[str, Any]], key: str, low: str,
                high: str, color: str) -> None:
    """95% bootstrap intervals (over repeats) as error bars, where a row has one."""
    have = [(x, p) for x, p in zip(xs, pts, strict=True)
            if p.get(low) is not None and p.get(high) is not None]
    if have:
        ax.errorbar([x for x, _ in have], [p[key] for _, p in have],
                    # a percentile interval need not hold the point: clip, never negative
                    yerr=[[max(0.0, p[key] - p[low]) for _, p in have],
                          [max(0.0, p[high] - p[key]) for _, p in have]],
                    fmt="none", ecolor=color, capsize=3, alpha=0.8)


def _subplots(plt: Any, n: int) -> tuple[Any, list[Any]]:
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    return fig, list(axes[0])


def _device_ticks(ax: Any, rows: list[dict[str, Any]]) -> None:
    counts = sorted({r["num_devices"] for r in rows})
    if counts:
        ax.set_xticks(counts)


def _axes(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def render_memory_chart(results_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """The memory one device held (the most of any device of the run, the median over
    repeats) per configuration and device count, a bar chart per model, the model state
    (parameters, gradients, optimizer) as a mark on each bar; None when no row has memory."""
    have = [r for r in rows if r.get("memory_peak_bytes") is not None]
    if not have:
        return None
    plt = pyplot()

    models = sorted({r["model"] for r in have})
    width = max(6.5, 0.55 * max(sum(r["model"] == m for r in have) for m in models))
    fig, axes = plt.subplots(1, len(models), figsize=(width * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = sorted((r for r in have if r["model"] == model),
                      key=lambda r: (_series_label(r), r["num_devices"]))
        xs = range(len(mine))
        bars = ax.bar(xs, [r["memory_peak_bytes"] / 2**30 for r in mine])
        ax.bar_label(bars, [columns.cell(columns.column("memory_peak_bytes"), r, "table")
                            for r in mine], fontsize=7)
        state = [(x, r["model_state_bytes"] / 2**30) for x, r in zip(xs, mine, strict=True)
                 if r.get("model_state_bytes") is not None]
        if state:
            ax.plot([x for x, _ in state], [s for _, s in state], "_", color="black",
                    markersize=18, label="model state (params + grads + optimizer)")
        ax.set_xticks(list(xs), [f"{_series_label(r).replace(' [virtual CPU devices]', '')}"
                                 f"\nn={r['num_devices']}" for r in mine],
                      rotation=30, ha="right", fontsize=7)
        _axes(ax, model, "", "GiB per device")
        # headroom above the tallest bar for its label and the legend
        ax.set_ylim(0, 1.3 * max((r["memory_peak_bytes"] / 2**30 for r in mine), default=1))
    virtual = any(r["virtual_devices"] for r in have)
    fig.suptitle("Memory per device in the timed window (framework allocator's peak; on CPU "
                 "the process's peak resident memory" + (", shared by its virtual devices"
                                                         if virtual else "") + ")")
    return save(fig, Path(results_dir) / "charts" / MEMORY_CHART, plt)


def render_tokens_chart(results_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Tokens/sec against the device count for the token models (their images/sec is
    samples/sec), the ideal line from each series' 1-device point; None without them."""
    ok = [r for r in rows if r.get("tokens_per_sec") is not None]
    if not ok:
        return None
    plt = pyplot()

    models = sorted({r["model"] for r in ok})
    series: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        for label in _series_labels(r, ok):
            series[(r["model"], label)].append(r)
    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        for label, pts, line in _device_series(ax, series, model, "tokens_per_sec",
                                               "tokens_per_sec_ci_low",
                                               "tokens_per_sec_ci_high"):
            base = next((p for p in pts if p["num_devices"] == 1), None)
            if base is not None:
                xs = [p["num_devices"] for p in pts]
                ax.plot(xs, [base["tokens_per_sec"] * x for x in xs], "--",
                        color=line.get_color(), alpha=0.5, label=f"ideal ({label.split()[0]})")
        _device_axes(ax, model, "tokens/sec", ok)
    fig.suptitle("Token throughput vs device count\n(tokens/sec = samples/sec x sequence "
                 "length)")
    return save(fig, Path(results_dir) / "charts" / TOKENS_CHART, plt)


def render_real_chart(results_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Synthetic vs real-data throughput per runner and device count, input-bound marked."""
    real = [r for r in rows if r["real_vs_synthetic"] is not None]
    if not real:
        return None
    plt = pyplot()

    models = sorted({r["model"] for r in real})
    fig, axes = plt.subplots(1, len(models), figsize=(max(6.5, 1.2 * len(real)) * len(models),
                                                      4.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = sorted((r for r in real if r["model"] == model),
                      key=lambda r: (runner_label(r), r["num_devices"], r["data_label"]))
        xs = range(len(mine))
        syn = [r["images_per_sec"] / r["real_vs_synthetic"] for r in mine]
        ax.bar([x - 0.2 for x in xs], syn, 0.4, label="synthetic", color="#999999")
        bars = ax.bar([x + 0.2 for x in xs], [r["images_per_sec"] for r in mine], 0.4,
                      label="real", color=["#d62728" if r["input_bound"] else "#1f77b4"
                                           for r in mine])
        ax.bar_label(bars, [f"{r['real_vs_synthetic']:.0%}" + ("\ninput-bound"
                                                               if r["input_bound"] else "")
                            for r in mine], fontsize=7)
        ax.set_xticks(list(xs), [f"{runner_label(r)}\nn={r['num_devices']} "
                                 f"w={r['loader_workers']}" for r in mine],
                      rotation=30, ha="right", fontsize=7)
        _axes(ax, model, "", "images/sec")
        ax.set_ylim(bottom=0)
    fig.suptitle(f"Real data vs synthetic (red: input-bound, below {INPUT_BOUND_RATIO:.0%})")
    return save(fig, Path(results_dir) / "charts" / REAL_CHART, plt)


def render_pipeline_chart(results_dir: Path, rows: list[dict[str, Any]]) -> Path | None:
    """Each input pipeline's images/sec against its worker count, the naive loop as a line."""
    ok = [r for r in rows if r["images_per_sec"] is not None]
    if not ok:
        return None
    plt = pyplot()

    models = sorted({r["model"] for r in ok})
    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        mine = [r for r in ok if r["model"] == model]
        for r in (r for r in mine if r["pipeline"] == BASELINE):
            ax.axhline(r["images_per_sec"], color="grey", linestyle="--",
                       label=f"{BASELINE} (1 process) b={r['batch']}")
        series: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
        for r in mine:
            if r["pipeline"] != BASELINE:
                series[(r["pipeline"], r["batch"])].append(r)
        for (name, batch), pts in sorted(series.items()):
            pts.sort(key=lambda r: r["loader_workers"])
            ax.plot([p["loader_workers"] for p in pts], [p["images_per_sec"] for p in pts],
                    "o-", label=f"{name} b={batch}")
        _axes(ax, f"{model} ({mine[0]['image_size']} px crops)", "loader workers",
              "images/sec")
        ax.set_ylim(bottom=0)
    fig.suptitle("Input pipelines alone: decode, augment, batch (no model)")
    return save(fig, Path(results_dir) / "charts" / PIPELINE_CHART, plt)


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
