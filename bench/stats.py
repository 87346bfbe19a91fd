"""Summary maths: mean images/sec per configuration, speedup and scaling efficiency."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

GROUP_FIELDS = ("runner", "model", "data", "precision", "scaling", "batch", "device")
SUMMARY_FIELDS = (
    "runner", "model", "device", "virtual_devices", "num_devices", "scaling",
    "batch_size_per_device", "global_batch_size", "data", "precision", "status", "runs_ok",
    "runs_total", "images_per_sec", "images_per_sec_std", "speedup", "scaling_efficiency",
    "reason",
)


def batch_of(rec: dict[str, Any]) -> int:
    """The batch that is held fixed across device counts: per device (weak) or global."""
    return rec["batch_size_per_device"] if rec["scaling"] == "weak" else rec["global_batch_size"]


def group_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(batch_of(rec) if f == "batch" else rec[f] for f in GROUP_FIELDS)


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


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration and device count (repeats folded into mean and std).

    Speedup is against the 1-device row of the same runner, model, data, batch, precision,
    scaling and device kind; rows without a 1-device baseline get None."""
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        by_config[(*group_key(rec), rec["num_devices"])].append(rec)
    rows = []
    for key, recs in by_config.items():
        ok = [r["images_per_sec"] for r in recs if r["status"] == "ok"]
        first = recs[0]
        statuses = sorted({r["status"] for r in recs})
        rows.append({
            "runner": first["runner"], "model": first["model"], "device": first["device"],
            "virtual_devices": first["virtual_devices"], "num_devices": key[-1],
            "scaling": first["scaling"], "batch_size_per_device": first["batch_size_per_device"],
            "global_batch_size": first["global_batch_size"], "data": first["data"],
            "precision": first["precision"],
            "status": "ok" if ok else "/".join(statuses),
            "runs_ok": len(ok), "runs_total": len(recs),
            "images_per_sec": statistics.fmean(ok) if ok else None,
            "images_per_sec_std": statistics.stdev(ok) if len(ok) > 1 else None,
            "reason": next((r["reason"] for r in recs if r.get("reason")), None),
            "_group": key[:-1],
        })
    baselines = {r["_group"]: r["images_per_sec"] for r in rows if r["num_devices"] == 1}
    for row in rows:
        row["speedup"] = speedup(row["images_per_sec"], baselines.get(row.pop("_group")))
        row["scaling_efficiency"] = efficiency(row["speedup"], row["num_devices"])
    rows.sort(key=lambda r: (r["runner"], r["model"], r["data"], r["precision"],
                             r["global_batch_size"] if r["scaling"] == "strong"
                             else r["batch_size_per_device"], r["num_devices"]))
    return rows
