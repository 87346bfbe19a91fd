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


def read_series(path: Path) -> list[dict[str, Any]]:
    """A telemetry CSV back as rows of floats (None for empty cells)."""
    with open(path, newline="") as fh:
        return [{k: float(v) if v not in ("", None) else None for k, v in row.items()}
                for row in csv.DictReader(fh)]


def render_run(rec: dict[str, Any], results_dir: Path, plt: Any) -> Path | None:
    """charts/telemetry/<run_id>.png for one record with a telemetry series; None without."""
    tel = rec.get("telemetry") or {}
    path = Path(results_dir) / tel["path"] if tel.get("path") else None
    if path is None or not path.is_file():
        return None
    rows = read_series(path)
    if not rows:
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
        top.plot(t, [r["host_cpu_pct"] for r in rows], label="host CPU %")
        cores = rec.get("environment", {}).get("cpu_cores") or 1
        top.plot(t, [None if r["run_cpu_cores"] is None else 100 * r["run_cpu_cores"] / cores
                     for r in rows], label="this run's process tree, % of all cores")
        top.set_ylabel("CPU utilisation %")
        bottom.plot(t, [r["run_rss_bytes"] / 2**30 if r["run_rss_bytes"] is not None else None
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
    target = Path(results_dir) / "charts" / CHART_DIR / f"{rec['run_id']}.png"
    try:
        save_figure(fig, target, 90)  # whole or not at all
    finally:
        plt.close(fig)
    return target


def render_telemetry_charts(results_dir: Path, records: list[dict[str, Any]]) -> list[Path]:
    """One chart per run that has a telemetry series, in charts/telemetry/."""
    have = [r for r in records if (r.get("telemetry") or {}).get("path")]
    if not have:
        return []
    plt = pyplot()

    return [p for r in have if (p := render_run(r, results_dir, plt))]
