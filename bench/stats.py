"""Summary maths: mean images/sec per configuration, speedup and scaling efficiency."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.grouping import baseline_key, config_key, data_label, mode_of, synthetic_key
from bench.trust import (
    bootstrap_ci,
    coefficient_of_variation,
    estimators,
    ratio_ci,
    warmup_not_steady,
)

SUMMARY_FIELDS = (
    "runner", "model", "device", "virtual_devices", "num_devices", "scaling",
    "batch_size_per_device", "global_batch_size", "data", "loader_workers", "precision",
    "status", "runs_ok", "runs_total", "images_per_sec", "images_per_sec_ci_low",
    "images_per_sec_ci_high", "images_per_sec_std", "images_per_sec_cv", "mean_step_rate",
    "speedup", "speedup_ci_low", "speedup_ci_high", "scaling_efficiency",
    "efficiency_ci_low", "efficiency_ci_high", "unstable", "not_steady", "noisy", "starved",
    "contended", "gpu_util_pct", "run_cpu_cores", "joules_per_image", "mfu", "peak_flops",
    "placed_devices", "placement_collapsed", "batchnorm", "real_vs_synthetic", "input_bound",
    "reason",
)
PIPELINE_FIELDS = (
    "pipeline", "model", "image_size", "batch", "augmentation", "loader_workers", "cores",
    "device", "status", "runs_ok", "runs_total", "images_per_sec", "images_per_sec_std",
    "images_per_sec_per_core", "vs_baseline", "reason",
)
# A real-data run slower than this fraction of the same run on synthetic data is input-bound:
# its input pipeline, not the model, sets the pace.
INPUT_BOUND_RATIO = 0.9
BASELINE = "pil_loop"
# Repeats whose images/sec vary more than this (coefficient of variation) are noisy, unless
# the sweep's until_stable.target_cv says otherwise.
CV_TARGET = 0.05


def is_pipeline(rec: dict[str, Any]) -> bool:
    return rec.get("mode") == "pipeline"


def speedup(ips: float | None, baseline: float | None) -> float | None:
    """ips / baseline, or None when either is missing."""
    if ips is None or not baseline:
        return None
    return ips / baseline


def efficiency(spd: float | None, num_devices: int, baseline_devices: int = 1) -> float | None:
    """Scaling efficiency: speedup over the ideal (linear) speedup."""
    if spd is None:
        return None
    return spd / (num_devices / baseline_devices)


def run_flags(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """The estimators and flags of a configuration's ok runs: unstable when a run's
    estimators disagree by more than 2% (stalls), not_steady when a run's first timed slice
    was much slower than the rest (warm-up too short); None when no run could tell."""
    per_run = [(estimators(r.get("step_times_s") or [], r["global_batch_size"]),
                warmup_not_steady(r.get("step_times_s") or [])) for r in recs]
    disagree = [e["estimators_disagree"] for e, _ in per_run
                if e["estimators_disagree"] is not None]
    steady = [ns for _, ns in per_run if ns is not None]
    means = [e["mean_step_rate"] for e, _ in per_run if e["mean_step_rate"] is not None]
    return {"unstable": any(disagree) if disagree else None,
            "not_steady": any(steady) if steady else None,
            "mean_step_rate": statistics.median(means) if means else None}


def _median_of(recs: list[dict[str, Any]], *path: str) -> float | None:
    """The median of a nested numeric field over records that have it."""
    values = []
    for rec in recs:
        node: Any = rec
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            values.append(node)
    return statistics.median(values) if values else None


def telemetry_columns(recs: list[dict[str, Any]], cv: float | None,
                      cv_target: float) -> dict[str, Any]:
    """A configuration's telemetry, energy and MFU (medians over its ok runs), and the
    starved (any run's GPUs below the threshold) and noisy (CV above target) flags."""
    starved = [r["telemetry"]["starved"] for r in recs
               if (r.get("telemetry") or {}).get("starved") is not None]
    contended = [r["contended"] for r in recs if r.get("contended") is not None]
    return {
        "noisy": None if cv is None else cv > cv_target,
        "starved": any(starved) if starved else None,
        # any run of the configuration shared the machine (bench/telemetry.py: contention)
        "contended": any(contended) if contended else None,
        "gpu_util_pct": _median_of(recs, "telemetry", "gpu_util_mean_pct"),
        "run_cpu_cores": _median_of(recs, "telemetry", "host", "run_cpu_cores_mean"),
        "joules_per_image": _median_of(recs, "telemetry", "joules_per_image"),
        "mfu": _median_of(recs, "mfu", "mfu"),
        "peak_flops": _median_of(recs, "mfu", "peak_flops"),
    }


def placement_columns(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Where a configuration's ok runs worked, as their frameworks reported it: the fewest
    devices any run's placement named, the framework's own collapse note if any, and the
    BatchNorm statistics' scope the runner reported (per_device, global)."""
    placed = [len(r["placement"]) for r in recs if isinstance(r.get("placement"), dict)]
    results = [r.get("result") or {} for r in recs]
    return {
        "placed_devices": min(placed) if placed else None,
        "placement_collapsed": next((x["placement_collapsed"] for x in results
                                     if x.get("placement_collapsed")), None),
        "batchnorm": next((x["batchnorm"] for x in results if x.get("batchnorm")), None),
    }


def summarise(records: list[dict[str, Any]], cv_target: float = CV_TARGET
              ) -> list[dict[str, Any]]:
    """One row per configuration and device count: the median images/sec over repeats with
    its 95% bootstrap interval, spread, the flags of run_flags, and telemetry_columns.

    Speedup is the median against the median of the 1-device row of the same configuration
    (bench.grouping.baseline_key: runner, model, data label, precision, scaling, batch and
    device kind) with a bootstrap interval of that ratio; rows without a 1-device baseline
    get None. A row has the fields its records' key is read from, so config_key(row) is
    theirs."""
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if not is_pipeline(rec):
            by_config[config_key(rec)].append(rec)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    oks: dict[tuple[Any, ...], list[float]] = {}
    for key, recs in by_config.items():
        ok_recs = [r for r in recs if r["status"] == "ok"]
        ok = [r["images_per_sec"] for r in ok_recs]
        low, high = bootstrap_ci(ok)
        first = recs[0]
        statuses = sorted({r["status"] for r in recs})
        oks[key] = ok
        rows[key] = {
            "runner": first["runner"], "model": first["model"], "device": first["device"],
            "virtual_devices": first["virtual_devices"], "num_devices": first["num_devices"],
            "scaling": first["scaling"], "batch_size_per_device": first["batch_size_per_device"],
            "global_batch_size": first["global_batch_size"], "data": first["data"],
            "data_label": data_label(first), "mode": mode_of(first),
            "loader_workers": (first.get("dataset") or {}).get("workers"),
            "precision": first["precision"],
            "status": "ok" if ok else "/".join(statuses),
            "runs_ok": len(ok), "runs_total": len(recs),
            "images_per_sec": statistics.median(ok) if ok else None,
            "images_per_sec_ci_low": low, "images_per_sec_ci_high": high,
            "images_per_sec_std": statistics.stdev(ok) if len(ok) > 1 else None,
            "images_per_sec_cv": coefficient_of_variation(ok),
            **run_flags(ok_recs),
            **telemetry_columns(ok_recs, coefficient_of_variation(ok), cv_target),
            **placement_columns(ok_recs),
            "reason": next((r["reason"] for r in recs if r.get("reason")), None),
        }
    for key, row in rows.items():
        base = baseline_key(row)
        row["speedup"] = speedup(row["images_per_sec"],
                                 rows[base]["images_per_sec"] if base in rows else None)
        row["scaling_efficiency"] = efficiency(row["speedup"], row["num_devices"])
        low, high = ratio_ci(oks[key], oks.get(base, []))
        row["speedup_ci_low"], row["speedup_ci_high"] = low, high
        row["efficiency_ci_low"] = efficiency(low, row["num_devices"])
        row["efficiency_ci_high"] = efficiency(high, row["num_devices"])
    compare_real_to_synthetic(rows)
    return sorted(rows.values(), key=summary_order)


def summary_order(r: dict[str, Any]) -> tuple[Any, ...]:
    """The summary's row order: runner, model, data, precision, batch, devices."""
    return (r["runner"], r["model"], r["data_label"], r["precision"],
            r["global_batch_size"] if r["scaling"] == "strong" else r["batch_size_per_device"],
            r["num_devices"])


def compare_real_to_synthetic(rows: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    """Give each real-data row (rows by config_key) its throughput over the synthetic row of
    the same configuration and device count (bench.grouping.synthetic_key), and flag it
    input-bound below INPUT_BOUND_RATIO."""
    for row in rows.values():
        twin = rows.get(synthetic_key(row)) if row["data"] == "real" else None
        ratio = speedup(row["images_per_sec"], twin["images_per_sec"]) if twin else None
        row["real_vs_synthetic"] = ratio
        row["input_bound"] = None if ratio is None else ratio < INPUT_BOUND_RATIO


def summarise_pipelines(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per input pipeline, model, batch, augmentation and worker count (pipeline-mode
    records), with its throughput over the naive PIL loop's at the same settings."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if is_pipeline(rec):
            ds = rec.get("dataset") or {}
            groups[(rec["runner"], rec["model"], rec["global_batch_size"],
                    ds.get("augmentation"), ds.get("workers"), rec["device"])].append(rec)
    rows = []
    for (name, model, batch, aug, workers, device), recs in groups.items():
        ok = [r for r in recs if r["status"] == "ok"]
        ips = [r["images_per_sec"] for r in ok]
        results = [r.get("result") or {} for r in ok]
        per_core = [x["images_per_sec_per_core"] for x in results
                    if x.get("images_per_sec_per_core")]
        rows.append({
            "pipeline": name, "model": model, "batch": batch, "augmentation": aug,
            "loader_workers": workers, "device": device,
            "image_size": next((x.get("image_size") for x in results), None),
            "cores": next((x.get("cores") for x in results), None),
            "status": "ok" if ok else "/".join(sorted({r["status"] for r in recs})),
            "runs_ok": len(ok), "runs_total": len(recs),
            "images_per_sec": statistics.fmean(ips) if ips else None,
            "images_per_sec_std": statistics.stdev(ips) if len(ips) > 1 else None,
            "images_per_sec_per_core": statistics.fmean(per_core) if per_core else None,
            "reason": next((r["reason"] for r in recs if r.get("reason")), None),
        })
    base = {(r["model"], r["batch"], r["augmentation"], r["device"]): r["images_per_sec"]
            for r in rows if r["pipeline"] == BASELINE}
    for row in rows:
        row["vs_baseline"] = speedup(row["images_per_sec"], base.get(
            (row["model"], row["batch"], row["augmentation"], row["device"])))
    rows.sort(key=lambda r: (r["model"], r["batch"], r["pipeline"] != BASELINE, r["pipeline"],
                             r["loader_workers"] or 0))
    return rows
