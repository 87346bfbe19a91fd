"""One loader for notebooks and scripts: a results folder as a tidy pandas DataFrame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bench.grouping import GROUP_FIELDS, READERS, baseline_key, config_key
from bench.records import load_records
from bench.stats import summarise

SCALARS = (
    "run_id", "sweep_id", "runner", "family", "model", "num_devices", "virtual_devices",
    "device", "scaling", "batch_size_per_device", "global_batch_size", "data", "precision",
    "repeat", "warmup_steps", "measure_steps", "status", "reason", "images_per_sec", "samples",
    "first_loss", "last_loss", "window_start", "window_end", "wall_time_s", "started_at",
    "finished_at", "log_path",
)
# The grouping key's fields (bench.grouping) are columns too: data_label (synthetic or
# real-w<workers>), batch (the one held fixed across device counts) and mode besides the
# scalars above. Group on these to get summary.csv's configurations:
#   df.groupby([*GROUP_COLUMNS, "num_devices"])
GROUP_COLUMNS = GROUP_FIELDS


def _flatten(rec: dict[str, Any]) -> dict[str, Any]:
    row = {k: rec.get(k) for k in SCALARS}
    row.update({f: read(rec) for f, read in READERS.items()})
    row["loader_workers"] = (rec.get("dataset") or {}).get("workers")
    env = rec.get("environment") or {}
    for key in ("host", "os", "cpu_model", "cpu_cores", "memory_bytes", "python",
                "harness_commit"):
        row[f"env_{key}"] = env.get(key)
    row["env_gpus"] = ", ".join(g["name"] for g in env.get("gpus") or []) or None
    for name, version in (env.get("framework") or {}).items():
        row[f"version_{name}"] = version
    steps = rec.get("step_times_s") or []
    row["step_time_median_s"] = float(pd.Series(steps).median()) if steps else None
    result = rec.get("result") or {}
    row["layout"] = result.get("layout")
    placement = rec.get("placement") or {}
    row["placed_devices"] = len(placement) if placement else None
    row["placement_collapsed"] = result.get("placement_collapsed")
    row["batchnorm"] = result.get("batchnorm")
    for key, value in (rec.get("options") or {}).items():
        row[f"opt_{key}"] = value
    tel = rec.get("telemetry") or {}
    host = tel.get("host") or {}
    row.update({
        "gpu_util_pct": tel.get("gpu_util_mean_pct"), "starved": tel.get("starved"),
        "joules_per_image": tel.get("joules_per_image"), "energy_j": tel.get("energy_j"),
        "run_cpu_cores": host.get("run_cpu_cores_mean"),
        "run_rss_max_bytes": host.get("run_rss_max_bytes"),
        "host_cpu_util_pct": host.get("cpu_util_mean_pct"),
        "gpu_mem_peak_bytes": max((g["mem_used_peak_bytes"] or 0 for g in tel.get("gpus") or []),
                                  default=None),
        "telemetry_path": tel.get("path"),
    })
    m = rec.get("mfu") or {}
    row["mfu"], row["peak_flops"] = m.get("mfu"), m.get("peak_flops")
    return row


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """One row per run: the record's scalar fields, the grouping key's fields, the
    environment flattened, and the run's speedup and scaling efficiency against the 1-device
    throughput of its configuration: the median over repeats, summary.csv's images_per_sec
    of the row at bench.grouping.baseline_key. The median of a configuration's per-run
    speedups is summary.csv's speedup."""
    records = load_records(Path(results_dir))
    df = pd.DataFrame([_flatten(r) for r in records])
    if df.empty:
        return pd.DataFrame(columns=[*SCALARS, *GROUP_COLUMNS, "loader_workers", "speedup",
                                     "scaling_efficiency"])
    summary = {config_key(row): row["images_per_sec"] for row in summarise(records)}
    base = [summary.get(baseline_key(r)) for r in records]
    df["speedup"] = [ips / b if ips is not None and b else None
                     for ips, b in zip(df["images_per_sec"], base, strict=True)]
    df["scaling_efficiency"] = [s / n if s is not None else None
                                for s, n in zip(df["speedup"], df["num_devices"], strict=True)]
    return df
