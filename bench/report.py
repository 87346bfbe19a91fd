"""Outputs of a sweep: summary.csv, the terminal table, and the charts (matplotlib, PNG)."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.records import load_records
from bench.stats import SUMMARY_FIELDS, summarise

CHARTS = ("throughput.png", "efficiency.png", "largest_device_count.png")


def write_summary(results_dir: Path, rows: list[dict[str, Any]]) -> Path:
    path = Path(results_dir) / "summary.csv"
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=SUMMARY_FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row[k]) for k in SUMMARY_FIELDS})
    tmp.replace(path)
    return path


def _fmt(value: Any) -> Any:
    return round(value, 4) if isinstance(value, float) else ("" if value is None else value)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The summary as a fixed-width text table for the terminal."""
    head = ("runner", "model", "devices", "batch", "prec", "status", "img/s", "speedup",
            "effic.")
    lines = [head]
    for r in rows:
        kind = "vcpu" if r["virtual_devices"] else r["device"]
        batch = (f"{r['batch_size_per_device']}/dev" if r["scaling"] == "weak"
                 else f"{r['global_batch_size']} glob")
        ips = r["images_per_sec"]
        lines.append((
            r["runner"], r["model"], f"{r['num_devices']} {kind}", batch, r["precision"],
            r["status"] + (f" ({r['runs_ok']}/{r['runs_total']})" if r["runs_total"] > 1 else ""),
            f"{ips:.1f}" if ips is not None else "-",
            f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-",
            f"{r['scaling_efficiency']:.0%}" if r["scaling_efficiency"] is not None else "-",
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    reasons = [f"  {r['runner']} {r['model']} n={r['num_devices']}: {r['reason']}"
               for r in rows if r["status"] != "ok" and r.get("reason")]
    return "\n".join(out + (["", "Not ok:"] + reasons if reasons else []))


def _series_label(row: dict[str, Any]) -> str:
    batch = (f"{row['batch_size_per_device']}/dev" if row["scaling"] == "weak"
             else f"{row['global_batch_size']} global")
    tag = " [virtual CPU devices]" if row["virtual_devices"] else ""
    return f"{row['runner']} {row['precision']} b={batch}{tag}"


def render_charts(results_dir: Path, rows: list[dict[str, Any]]) -> list[Path]:
    """Throughput with the ideal line, efficiency, and all runners at the largest count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(results_dir) / "charts"
    out.mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if r["images_per_sec"] is not None]
    models = sorted({r["model"] for r in ok}) or ["(no ok runs)"]
    virtual = any(r["virtual_devices"] for r in ok)
    note = " (virtual CPU devices: not GPU scaling)" if virtual else ""
    series: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ok:
        series[(r["model"], _series_label(r))].append(r)
    paths = []

    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        for (m, label), pts in sorted(series.items()):
            if m != model:
                continue
            pts.sort(key=lambda r: r["num_devices"])
            xs = [p["num_devices"] for p in pts]
            line, = ax.plot(xs, [p["images_per_sec"] for p in pts], "o-", label=label)
            base = next((p for p in pts if p["num_devices"] == 1), None)
            if base is not None:
                ax.plot(xs, [base["images_per_sec"] * x for x in xs], "--",
                        color=line.get_color(), alpha=0.5, label=f"ideal ({label.split()[0]})")
        _axes(ax, model, "devices", "images/sec")
        _device_ticks(ax, [r for r in ok if r["model"] == model])
        ax.set_ylim(bottom=0)
    fig.suptitle("Throughput vs device count" + note)
    paths.append(_save(fig, out / CHARTS[0], plt))

    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        ax.axhline(1.0, color="grey", linestyle="--", label="ideal (100%)")
        for (m, label), pts in sorted(series.items()):
            pts = [p for p in pts if p["scaling_efficiency"] is not None]
            if m != model or not pts:
                continue
            pts.sort(key=lambda r: r["num_devices"])
            ax.plot([p["num_devices"] for p in pts], [p["scaling_efficiency"] for p in pts],
                    "o-", label=label)
        _axes(ax, model, "devices", "scaling efficiency")
        _device_ticks(ax, [r for r in ok if r["model"] == model])
        ax.set_ylim(bottom=0)
    fig.suptitle("Scaling efficiency (speedup / devices)" + note)
    paths.append(_save(fig, out / CHARTS[1], plt))

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
    paths.append(_save(fig, out / CHARTS[2], plt))
    return paths


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


def _save(fig: Any, path: Path, plt: Any) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build_report(results_dir: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """Re-read a results folder's records; write summary.csv and the charts."""
    rows = summarise(load_records(results_dir))
    write_summary(results_dir, rows)
    return rows, render_charts(results_dir, rows)
