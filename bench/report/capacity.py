"""Capacity mode's outputs: capacity.csv, the terminal table and report.html's "Capacity"
section, one row per search from its capacity record (bench/run/capacity.py: results folder's
capacity/<search id>.json).

A row: the strategy (runner), model, devices, precision, what was grown (batch per device or
layers), the largest value that fit and the first that did not, the peak one device held at
the largest fit (the most over its devices: device_peak_bytes), the model state one device held
there (state_bytes_per_device where the runner reports it, each part summed: the most over the
devices; else its model_state), the budget and the probes run.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from bench.records.grouping import runner_label, variant_of
from bench.run.capacity import load_capacity
from bench.text_table import aligned

CSV_NAME = "capacity.csv"
CAPACITY_FIELDS = (
    "runner", "model", "num_devices", "device", "virtual_devices", "precision", "scale",
    "batch_size_per_device", "largest_fit", "first_misfit", "end", "peak_bytes_at_largest",
    "state_bytes_at_largest", "params_at_largest", "device_memory", "probes", "status",
    "reason", "limit", "search_id", "variant",
)
HEAD = ("strategy", "model", "devices", "prec", "grows", "largest", "first misfit",
        "peak/dev", "state/dev", "budget/dev", "probes", "status")


def state_bytes(rec: dict[str, Any]) -> int | None:
    """The model state one device held at the largest fit: the most, over the devices of
    state_bytes_per_device, of params + grads + optimizer; else the record's model_state
    total; None where neither is there."""
    per_device = rec.get("state_bytes_per_device")
    if isinstance(per_device, dict) and per_device:
        totals = [sum(v for v in parts.values() if isinstance(v, int))
                  for parts in per_device.values() if isinstance(parts, dict)]
        if totals:
            return max(totals)
    state = rec.get("model_state")
    return state.get("total_bytes") if isinstance(state, dict) else None


def capacity_rows(results_dir: Path) -> list[dict[str, Any]]:
    """One row per search of the results folder, in CAPACITY_FIELDS."""
    rows = []
    for rec in load_capacity(results_dir):
        row = {k: rec.get(k) for k in CAPACITY_FIELDS}
        row["state_bytes_at_largest"] = state_bytes(rec)
        row["probes"] = len(rec.get("probes") or [])
        row["variant"] = variant_of(rec)  # the options of an option axis: stage=3
        if rec.get("scale") == "batch":  # the batch is what was searched
            row["batch_size_per_device"] = None
        rows.append(row)
    rows.sort(key=lambda r: (r["model"], r["scale"], r["precision"], r["num_devices"],
                             r["runner"], r["variant"]))
    return rows


def _mib(value: Any) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, int) else "-"


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    grows = ("layers (b=" + str(r["batch_size_per_device"]) + ")" if r["scale"] == "depth"
             else "batch/dev")
    kind = "vcpu" if r["virtual_devices"] else r["device"]
    return (runner_label(r), r["model"], f"{r['num_devices']} {kind}",
            r["precision"], grows, str(r["largest_fit"] if r["largest_fit"] is not None else "-"),
            str(r["first_misfit"] if r["first_misfit"] is not None else "-"),
            _mib(r["peak_bytes_at_largest"]), _mib(r["state_bytes_at_largest"]),
            _mib(r["device_memory"]) if r["device_memory"] else "the device's",
            str(r["probes"]), r["status"] + ("" if r["end"] in ("bracketed", None)
                                             else f" ({r['end']})"))


def format_capacity_table(rows: list[dict[str, Any]]) -> str:
    """The terminal table, its legend and the reasons of searches not ok."""
    reasons = [f"  {runner_label(r)} {r['model']} n={r['num_devices']}: {r['reason']}"
               for r in rows if r.get("reason")]
    limits = sorted({r["limit"] for r in rows if r.get("limit")})
    return "\n".join(
        ["Capacity (mode: capacity): the largest batch per device or depth that fits, by "
         "doubling then bisection, each probe its own run:", *aligned([HEAD, *map(_cells, rows)]),
         "", "peak/dev: the most one device held at the largest fit; state/dev: the model "
         "state (parameters, gradients, optimizer) one device held there", "limit: "
         + "; ".join(limits), f"per search: {CSV_NAME}; every probe: capacity/<search>.json"]
        + (["", "Not bracketed:", *reasons] if reasons else []))


def capacity_table(results_dir: Path) -> str | None:
    """The terminal table of a results folder's searches, None without any."""
    rows = capacity_rows(results_dir)
    return format_capacity_table(rows) if rows else None


def html_section(results_dir: Path) -> str:
    """report.html's "Capacity" section ("" without capacity records)."""
    rows = capacity_rows(results_dir)
    if not rows:
        return ""
    e = html.escape
    th = "".join(f"<th>{e(h)}</th>" for h in HEAD)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in _cells(r)) + "</tr>"
                   for r in rows)
    limits = "".join(f"<li>{e(x)}</li>" for x in sorted({r["limit"] for r in rows
                                                          if r.get("limit")}))
    reasons = "".join(f"<li>{e(runner_label(r))} {e(r['model'])} n={r['num_devices']}: "
                      f"{e(str(r['reason']))}</li>" for r in rows if r.get("reason"))
    return "".join([
        "<h2>Capacity</h2>",
        "<p>Per strategy, the largest batch per device (or the deepest GPT, at a fixed batch) "
        "that fits: doubling from the start until a probe does not fit, then bisection; "
        "each probe an ordinary benchmark run of its own (probes/runs/), an out-of-memory "
        "error or a peak over the budget being a misfit. peak/dev is the most one device "
        "held at the largest fit, state/dev the model state one device held there. Every "
        f"probe: capacity/&lt;search&gt;.json; per search: {CSV_NAME}.</p>",
        f"<p><b>Limit:</b></p><ul>{limits}</ul>",
        f"<table><tr>{th}</tr>{body}</table>",
        f"<ul>{reasons}</ul>" if reasons else "",
    ])
