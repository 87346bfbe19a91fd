"""Summary maths: median images/sec per configuration, speedup and scaling efficiency, and the
one rule for the interval over repeats every output shows (`median_interval`, `ratio_interval`,
named by `interval_kind`)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.records import columns
from bench.records.grouping import (
    baseline_key,
    config_key,
    data_label,
    mode_of,
    synthetic_key,
    variant_of,
)
from bench.records.trust import (
    BOOTSTRAP_SAMPLES,
    CONFIDENCE,
    baseline_doubts,
    bootstrap_ci,
    coefficient_of_variation,
    estimators,
    ratio_ci,
    speedup_impossible,
    warmup_not_steady,
)

# summary.csv's columns are bench/records/columns.py's (columns.keys("csv"), read when a report is
# written); this is that list at import, for readers of the old name.
SUMMARY_FIELDS = columns.keys("csv")
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

# The interval over repeats, one rule for every output (tables, report.html, results.md,
# compare, converge): 1 value has none; 2 give their range, called so (a bootstrap of 2 values
# returns exactly their min and max: no confidence interval); from 3 on the percentile
# bootstrap CI of the median.
NO_INTERVAL, RANGE, BOOTSTRAP_CI = "none", "range", f"{CONFIDENCE:.0%} bootstrap CI"
MIN_CI_REPEATS = 3
INTERVAL_MEANING = {
    RANGE: "range (2 repeats): the lowest and highest of two repeats; too few for a "
           "confidence interval",
    BOOTSTRAP_CI: f"{BOOTSTRAP_CI}: the percentile bootstrap confidence interval of the median "
                  f"over {MIN_CI_REPEATS} or more repeats ({BOOTSTRAP_SAMPLES} resamples, "
                  "seeded)",
}


def interval_kind(n: int) -> str:
    """The interval n repeats give: none (under 2), range (2), else the bootstrap CI."""
    return NO_INTERVAL if n < 2 else RANGE if n < MIN_CI_REPEATS else BOOTSTRAP_CI


def interval_name(kind: str | None) -> str:
    """An interval's name as the outputs print it: 'range (2 repeats)', '95% bootstrap CI';
    '' for none."""
    return {RANGE: "range (2 repeats)", BOOTSTRAP_CI: BOOTSTRAP_CI}.get(kind or "", "")


def interval_notes(kinds: Any) -> list[str]:
    """What each interval kind among `kinds` is, one line each (under a table)."""
    present = set(kinds)
    return [meaning for kind, meaning in INTERVAL_MEANING.items() if kind in present]


def median_interval(values: list[float]) -> tuple[float | None, float | None, str]:
    """(low, high, kind) of the median of repeats' values, by interval_kind."""
    kind = interval_kind(len(values))
    if kind == RANGE:
        return min(values), max(values), kind
    low, high = bootstrap_ci(values) if kind == BOOTSTRAP_CI else (None, None)
    return low, high, kind


def ratio_interval(numerator: list[float], denominator: list[float]
                   ) -> tuple[float | None, float | None, str]:
    """(low, high, kind) of median(numerator) / median(denominator) over independent runs:
    kind by the side with fewer values; a range is the extreme ratios any two runs give."""
    kind = interval_kind(min(len(numerator), len(denominator)))
    if kind == RANGE:
        return (min(numerator) / max(denominator), max(numerator) / min(denominator), kind)
    low, high = ratio_ci(numerator, denominator) if kind == BOOTSTRAP_CI else (None, None)
    return low, high, kind


def is_pipeline(rec: dict[str, Any]) -> bool:
    return rec.get("mode") == "pipeline"


def is_allreduce(rec: dict[str, Any]) -> bool:
    """A communication probe's record (bench/report/allreduce.py summarises those)."""
    return rec.get("mode") == "allreduce"


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


def summarise(records: list[dict[str, Any]], cv_target: float = CV_TARGET
              ) -> list[dict[str, Any]]:
    """One row per configuration and device count: the median images/sec over repeats with
    its interval (median_interval; `interval` names its kind), spread, the flags of run_flags
    and noisy, and the columns bench/records/columns.py combines over the runs itself (the
    configuration's fields, telemetry, energy, MFU, placement: columns.summary_values).

    Speedup is the median against the median of the 1-device row of the same configuration
    (bench.records.grouping.baseline_key: runner, model, data label, precision, scaling, batch and
    device kind) with the interval of that ratio (ratio_interval; `speedup_interval` names
    its kind); rows without a 1-device baseline get None. A row has the fields its records'
    key is read from, so config_key(row) is theirs."""
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if not is_pipeline(rec) and not is_allreduce(rec):
            by_config[config_key(rec)].append(rec)
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    oks: dict[tuple[Any, ...], list[float]] = {}
    for key, recs in by_config.items():
        ok_recs = [r for r in recs if r["status"] == "ok"]
        ok = [r["images_per_sec"] for r in ok_recs]
        low, high, kind = median_interval(ok)
        first = recs[0]
        statuses = sorted({r["status"] for r in recs})
        oks[key] = ok
        cv = coefficient_of_variation(ok)
        rows[key] = {
            # the registry's columns combined over the runs (bench/records/columns.py: over_runs)
            **columns.summary_values(recs, ok_recs),
            "data_label": data_label(first), "mode": mode_of(first),
            "status": "ok" if ok else "/".join(statuses),
            "runs_ok": len(ok), "runs_total": len(recs),
            "images_per_sec": statistics.median(ok) if ok else None,
            "images_per_sec_ci_low": low, "images_per_sec_ci_high": high, "interval": kind,
            "images_per_sec_std": statistics.stdev(ok) if len(ok) > 1 else None,
            "images_per_sec_cv": cv,
            **run_flags(ok_recs),
            "noisy": None if cv is None else cv > cv_target,
            "reason": next((r["reason"] for r in recs if r.get("reason")), None),
        }
    for key, row in rows.items():
        add_speedup(row, rows.get(baseline_key(row)), oks[key],
                    oks.get(baseline_key(row), []))
    compare_real_to_synthetic(rows)
    for row in rows.values():  # a token model's interval in tokens/sec (the charts' bars)
        tokens = row.get("tokens_per_sample")
        for end in ("low", "high"):
            value = row[f"images_per_sec_ci_{end}"]
            row[f"tokens_per_sec_ci_{end}"] = (value * tokens if tokens and value is not None
                                               else None)
    return sorted(rows.values(), key=summary_order)


def add_speedup(row: dict[str, Any], base: dict[str, Any] | None, ok: list[float],
                base_ok: list[float]) -> None:
    """Give a summary row its speedup over its 1-device row `base` (None without one),
    efficiency and their intervals (ratio_interval over the ok runs' images/sec), and their
    flags (bench/records/trust.py): speedup_impossible, and baseline_suspect with
    baseline_flags naming the baseline's doubts (contended, unstable) on a row that is not
    its own baseline."""
    n = row["num_devices"]
    row["speedup"] = speedup(row["images_per_sec"], base["images_per_sec"] if base else None)
    row["scaling_efficiency"] = efficiency(row["speedup"], n)
    low, high, kind = ratio_interval(ok, base_ok)
    row["speedup_ci_low"], row["speedup_ci_high"], row["speedup_interval"] = low, high, kind
    row["efficiency_ci_low"], row["efficiency_ci_high"] = efficiency(low, n), efficiency(high, n)
    row["speedup_impossible"] = speedup_impossible(row["speedup"], n)
    judged = base is not None and base is not row and row["speedup"] is not None
    doubts = baseline_doubts(base) if judged and base else []
    row["baseline_flags"] = " ".join(doubts) or None
    row["baseline_suspect"] = bool(doubts) if judged else None


def summary_order(r: dict[str, Any]) -> tuple[Any, ...]:
    """The summary's row order: runner, variant, model, data, precision, batch, nodes,
    devices."""
    return (r["runner"], variant_of(r), r["model"], r["data_label"], r["precision"],
            r["global_batch_size"] if r["scaling"] == "strong" else r["batch_size_per_device"],
            r.get("num_nodes") or 1, r["num_devices"])


def compare_real_to_synthetic(rows: dict[tuple[Any, ...], dict[str, Any]]) -> None:
    """Give each real-data row (rows by config_key) its throughput over the synthetic row of
    the same configuration and device count (bench.records.grouping.synthetic_key), and flag it
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
