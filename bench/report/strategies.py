"""The strategy table (issue 27): for a sweep that ran two or more strategies (runners, or one
runner with different options: DeepSpeed's ZeRO stage, FSDP2's reshard_after_forward) on
one model, a table per model and device count: each strategy's throughput, the most memory one
device held, the most model state one device held with its split (params / grads / optimizer,
from the record's state_bytes_per_device, read from the framework's shards), MFU, the precision
policy it followed (contract/precision_policy.summary) and its status; with the published rows
of that model that name a strategy (reference/published.csv: torchtitan, llm-foundry,
DeepSpeed) under it. Written to strategies.csv, report.html's "Strategies" section and the
terminal. Records from runners that do not report state or policy show blanks there.

Configurations are compared like with like: the same model, device kind, device and node count,
precision, data, scaling and batch; each strategy's figures are medians over its ok runs. A
strategy is a runner and the options its runs vary in (an option axis), named as every table
names it (bench.records.grouping.runner_label: `<runner> stage=3`).
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from typing import Any

from bench.analysis import published
from bench.records import columns
from bench.records.grouping import batch_of, data_label, mode_of, nodes_of, runner_label
from bench.text_table import aligned

CSV_NAME = "strategies.csv"
FIELDS = ("model", "device", "num_devices", "num_nodes", "precision", "data", "scaling",
          "batch", "strategy", "runner", "status", "runs_ok", "runs_total", "throughput",
          "throughput_unit", "memory_per_device_bytes", "state_per_device_bytes",
          "state_params_bytes", "state_grads_bytes", "state_optimizer_bytes", "state_device",
          "mfu", "precision_policy", "policy_follows", "reason")


MEMORY, MFU = columns.column("memory_peak_bytes"), columns.column("mfu")


def _median(values: list[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(nums) if nums else None


def _comparison_key(rec: dict[str, Any]) -> tuple[Any, ...]:
    return (rec["model"], rec.get("device"), rec["num_devices"], nodes_of(rec),
            rec.get("precision"), data_label(rec), rec.get("scaling"), batch_of(rec))


def strategy_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per strategy of every comparison (same model, devices, precision, data,
    scaling, batch) that ran two or more strategies; the figures are medians over ok runs."""
    groups: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = defaultdict(
        lambda: defaultdict(list))
    for rec in records:
        if mode_of(rec) == "benchmark" and rec.get("runner") and rec.get("model"):
            groups[_comparison_key(rec)][runner_label(rec)].append(rec)
    rows = []
    for key, by_strategy in sorted(groups.items(), key=lambda kv: str(kv[0])):
        if len(by_strategy) < 2:
            continue
        model, device, n, nodes, precision, data, scaling, batch = key
        for label, recs in sorted(by_strategy.items()):
            ok = [r for r in recs if r.get("status") == "ok"]
            tokens = _median([r.get("tokens_per_sec") for r in ok])
            splits = [s for s in (columns.state_split(r) for r in ok) if s]
            split = splits[0] if splits else {}
            policies = [r.get("precision_policy") for r in (ok or recs)
                        if isinstance(r.get("precision_policy"), dict)]
            rows.append({
                "model": model, "device": device, "num_devices": n, "num_nodes": nodes,
                "precision": precision, "data": data, "scaling": scaling, "batch": batch,
                "strategy": label, "runner": recs[0]["runner"],
                "status": "ok" if ok else "/".join(sorted({str(r.get("status"))
                                                           for r in recs})),
                "runs_ok": len(ok), "runs_total": len(recs),
                "throughput": tokens if tokens is not None
                else _median([r.get("images_per_sec") for r in ok]),
                "throughput_unit": "tokens/s" if tokens is not None else "samples/s",
                "memory_per_device_bytes": _median([columns.run_value(MEMORY, r) for r in ok]),
                "state_per_device_bytes": _median([s["total"] for s in splits]),
                "state_params_bytes": split.get("params"),
                "state_grads_bytes": split.get("grads"),
                "state_optimizer_bytes": split.get("optimizer"),
                "state_device": split.get("device"),
                "mfu": _median([columns.run_value(MFU, r) for r in ok]),
                "precision_policy": _policy(policies[0]) if policies else None,
                "policy_follows": policies[0].get("follows") if policies else None,
                "reason": next((r.get("reason") for r in recs if r.get("reason")), None),
            })
    return rows


def _policy(policy: dict[str, Any]) -> str | None:
    from contract.precision_policy import summary

    return summary(policy) or None


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _split(row: dict[str, Any]) -> str:
    parts = [row[f"state_{p}_bytes"] for p in columns.STATE_PARTS]
    if all(p is None for p in parts):
        return "-"
    return " / ".join(_bytes(p) for p in parts)


def _throughput(row: dict[str, Any]) -> str:
    value = row["throughput"]
    return "-" if value is None else f"{value:,.1f} {row['throughput_unit']}"


HEAD = ("strategy", "throughput", "mem/dev", "state/dev", "params / grads / optimizer",
        "MFU", "precision policy", "status")


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    return (row["strategy"], _throughput(row), _bytes(row["memory_per_device_bytes"]),
            _bytes(row["state_per_device_bytes"]), _split(row),
            "-" if row["mfu"] is None else f"{row['mfu']:.1%}",
            row["precision_policy"] or "-", row["status"])


def tables(rows: list[dict[str, Any]]) -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(model, the comparison's title, its rows) per comparison, in order."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[(r["model"], r["device"], r["num_devices"], r["num_nodes"], r["precision"],
             r["data"], r["scaling"], r["batch"])].append(r)
    result = []
    for (model, device, n, nodes, precision, data, scaling, batch), sel in out.items():
        where = f"{n} {device} device{'s' if n != 1 else ''}" + (
            f" on {nodes} nodes" if nodes > 1 else "")
        result.append((model, f"{model}, {where}, {precision}, {data}, {scaling} scaling, "
                              f"batch {batch}", sel))
    return result


PUBLISHED_HEAD = ("published", "strategy", "hardware", "GPUs", "precision", "seq len",
                  "tokens/s/GPU", "MFU", "TFLOPS/GPU", "mem/GPU GiB")


def _published_cells(r: dict[str, Any]) -> tuple[str, ...]:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    return (f"{r['source_short']}: {r['system']} ({r['model_as_published']})", r["strategy"],
            r["hardware"], str(r["gpus"]), r["precision"], num(r["seq_len"], ""),
            num(r["tokens_per_sec_per_gpu"], ","), num(r["mfu"], ".1%"),
            num(r["tflops_per_gpu"], "g"), num(r["memory_gib_per_gpu"], "g"))


def format_strategies(rows: list[dict[str, Any]]) -> str | None:
    """The terminal tables (None when no comparison ran two or more strategies)."""
    if not rows:
        return None
    parts = ["Strategies compared (same model, devices, precision, data, batch): throughput, "
             "the most memory one device held, the most model state one device held and its "
             "split (from the framework's shards), MFU, the precision policy followed:"]
    for model, title, sel in tables(rows):
        parts += ["", title, *aligned([HEAD, *(_cells(r) for r in sel)])]
        pub = published.strategy_rows(model)
        if pub:
            parts += ["published beside (reference/published.csv; other hardware, not "
                      "measured here):", *aligned([PUBLISHED_HEAD,
                                                   *(_published_cells(r) for r in pub)])]
    return "\n".join(parts)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _html_table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{th}</tr>{tr}</table>"


def html_section(records: list[dict[str, Any]]) -> str:
    """report.html's "Strategies" section ("" when no comparison ran two strategies)."""
    rows = strategy_rows(records)
    if not rows:
        return ""
    parts = ["<h2>Strategies</h2>",
             "<p>Each strategy on the same model, devices, precision, data and batch: "
             "throughput (tokens/s for token models, else samples/s; the median over ok "
             "runs), mem/dev the most memory one device held in the timed window, state/dev "
             "the most model state one device held (parameters + gradients + optimizer "
             "state, read from the framework's own shards: a sharded strategy's 1/N shows "
             "here) with its split, MFU, and the precision policy each followed ('(differs)' "
             "where it is not the harness's). A blank: the runner does not report it. "
             f"Every row: {CSV_NAME}. <code>run_bench.py predict RESULTS --strategies</code> "
             "prices each strategy's collectives on a probe's measured links.</p>"]
    for model, title, sel in tables(rows):
        parts += [f"<h3>{_e(title)}</h3>", _html_table(HEAD, [_cells(r) for r in sel])]
        pub = published.strategy_rows(model)
        if pub:
            parts += ["<p>Published beside (reference/published.csv: other hardware and "
                      "settings, not measured here; sources in the Published figures "
                      "section):</p>",
                      _html_table(PUBLISHED_HEAD, [_published_cells(r) for r in pub])]
        else:
            parts.append(f"<p>No published strategy figure for {_e(model)}.</p>")
    return "".join(parts)
