"""Per-run telemetry charts: utilisation and power over time, the timed window shaded.

Without NVML (CPU runs, machines without a driver) the chart shows what was sampled instead:
host CPU utilisation, the run's busy cores and its resident memory.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from bench.plotting import pyplot, save_figure
from bench.run.telemetry import gpu_indices_of

CHART_DIR = "telemetry"
MAX_NEW = 40  # charts a report draws (0.2-0.6 s each here); the rest wait for the next report


MAX_SERIES_BYTES = 16 * 2**20  # a run's series is a few KB a minute (records' bound)


def read_series(path: Path) -> list[dict[str, Any]]:
    """A telemetry CSV back as rows of floats (None for empty cells); [] for one that is not
    UTF-8, not numeric where a number belongs, or past MAX_SERIES_BYTES (no chart, no
    traceback)."""
    try:
        if path.stat().st_size > MAX_SERIES_BYTES:
            return []
        with open(path, newline="", encoding="utf-8") as fh:
            return [{k: float(v) if v not in ("", None) else None for k, v in row.items()}
                    for row in csv.DictReader(fh)]
    except (OSError, UnicodeDecodeError, ValueError, TypeError, csv.Error):
        return []


def series_path(rec: dict[str, Any], results_dir: Path) -> Path | None:
    """The run's telemetry CSV: a regular file inside the results folder (a record's path
    is never followed out of it, through `..` or a link), else None."""
    rel = (rec.get("telemetry") or {}).get("path")
    if not isinstance(rel, str) or not rel:
        return None
    try:
        base = Path(results_dir).resolve()
        path = (base / rel).resolve()
    except (OSError, RuntimeError, ValueError):  # a loop of links, a NUL
        return None
    return path if path.is_relative_to(base) and path.is_file() else None


def render_run(rec: dict[str, Any], path: Path, target: Path, plt: Any) -> Path | None:
    """Draw `target` (charts/telemetry/<run_id>.png) from one record's telemetry series at
    `path`; None for a series with nothing to draw."""
    tel = rec.get("telemetry") or {}
    rows = read_series(path)
    if not rows or any(not isinstance(r.get("t_rel"), float) for r in rows):
        return None
    t = [r["t_rel"] for r in rows]
    gpus = gpu_indices_of(rows)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    if gpus:
        for i in gpus:
            top.plot(t, [r.get(f"gpu{i}_util_pct") for r in rows], label=f"GPU {i}")
            bottom.plot(t, [r.get(f"gpu{i}_power_w") for r in rows], label=f"GPU {i}")
        top.axhline(tel.get("starved_below_pct") or 0, color="red", linestyle=":",
                    label="starved below")
        top.set_ylabel("GPU utilisation %")
        bottom.set_ylabel("power W")
    else:
        top.plot(t, [r.get("host_cpu_pct") for r in rows], label="host CPU %")
        cores = rec.get("environment", {}).get("cpu_cores") or 1
        top.plot(t, [None if r.get("run_cpu_cores") is None else 100 * r["run_cpu_cores"] / cores
                     for r in rows], label="this run's process tree, % of all cores")
        top.set_ylabel("CPU utilisation %")
        bottom.plot(t, [r["run_rss_bytes"] / 2**30 if r.get("run_rss_bytes") is not None else None
                        for r in rows], label="run's resident memory")
        bottom.set_ylabel("GiB")
    window = tel.get("window_s")
    for ax in (top, bottom):
        if window:
            ax.axvspan(0, window, color="green", alpha=0.12, label="timed window")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    top.set_ylim(0, 105)
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("seconds from the start of the timed window")
    why = tel.get("nvml", {}).get("reason") if not gpus else None
    fig.suptitle(f"{rec['run_id']} ({rec['status']})" + (f"\n{why}" if why else ""), fontsize=9)
    fig.tight_layout()
    try:
        save_figure(fig, target, 90)  # whole or not at all
    finally:
        plt.close(fig)
    return target


def _current(chart: Path, *sources: Path) -> bool:
    """Whether chart exists and is newer than every source that exists."""
    try:
        drawn = chart.stat().st_mtime
        return all(drawn >= src.stat().st_mtime for src in sources if src.exists())
    except OSError:
        return False


def render_telemetry_charts(results_dir: Path, records: list[dict[str, Any]]) -> list[Path]:
    """One chart per run that has a telemetry series, in charts/telemetry/: those drawn before
    and still current are kept; at most MAX_NEW are drawn per report (flagged runs first, then
    the latest), so a folder of thousands of runs reports in seconds and each later report
    draws the next ones. A line says when some were left for later."""
    results_dir = Path(results_dir)
    charts, todo = [], []
    for rec in _reading_order([r for r in records if (r.get("telemetry") or {}).get("path")]):
        path = series_path(rec, results_dir)
        if path is None:
            continue
        target = results_dir / "charts" / CHART_DIR / f"{rec['run_id']}.png"
        if _current(target, path, results_dir / "runs" / f"{rec['run_id']}.json"):
            charts.append(target)
        else:
            todo.append((rec, path, target))
    if todo:
        plt = pyplot()
        charts += [c for rec, path, target in todo[:MAX_NEW]
                   if (c := render_run(rec, path, target, plt))]
    if len(todo) > MAX_NEW:
        print(f"telemetry charts: {len(todo) - MAX_NEW} of {len(todo)} new ones left for the "
              f"next report (at most {MAX_NEW} drawn a report; each run's series is in runs/)",
              flush=True)
    return charts


def _reading_order(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Flagged runs (not ok, contended, starved, host-bound) first, then the latest finished."""
    latest = sorted(records, key=lambda r: str(r.get("finished_at") or ""), reverse=True)
    def flagged(r: dict[str, Any]) -> bool:
        tel = r.get("telemetry") or {}
        return bool(r.get("status") != "ok" or r.get("contended") or tel.get("starved")
                    or tel.get("host_bound"))
    return sorted(latest, key=lambda r: not flagged(r))
