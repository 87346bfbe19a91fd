"""The sweep's answer in a few sentences per model, from its summary rows and records: the
fastest configuration at each device count and by how much (named only where the intervals
over repeats do not overlap), the best scaling efficiency, the least memory per device, and
the configurations that failed or whose figures are flagged, with why (bench/records/trust.py's
doubts, the flag columns, a matmul peak flagged `implausible`).

The wording claims no more than the rows show: one run each has no interval, so no winner is
named; a flagged speedup or throughput is left out of the comparisons and listed with why.
report.html and the terminal print these first (bench/report/html.py, summary.py)."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from bench.records import columns
from bench.records.grouping import data_label, mode_of, runner_label
from bench.records.trust import doubts

# the flags doubts() already words as a figure that is no result
DOUBT_FLAGS = ("speedup_impossible", "baseline_suspect", "over_peak")
NO_WINNER = "no clear winner: intervals overlap"
NO_INTERVAL = "no clear winner: one run each, so no interval (repeats: 3 or more give one)"
FLAGGED = " [flagged: below]"  # after a figure of a row some flag is on in
TEXT_WIDTH = 100  # the terminal's findings are wrapped at this width
Finding = tuple[str, list[str]]  # a heading (a model, or the sweep) and its sentences


def _unit(row: Mapping[str, Any]) -> str:
    return "samples/s" if row.get("tokens_per_sample") else "img/s"


def _labeller(rows: list[dict[str, Any]]) -> Any:
    """A row's name among a model's rows: its runner (and variant), then the data, precision
    and batch where those differ among the rows."""
    parts = {"data": data_label, "precision": lambda r: r.get("precision"),
             "batch": lambda r: columns.cell(columns.column("batch_size_per_device"), r, "table")}
    varied = [read for read in parts.values() if len({str(read(r)) for r in rows}) > 1]
    return lambda r: " ".join([runner_label(r), *(str(read(r)) for read in varied)])


def _figure(row: Mapping[str, Any]) -> str:
    """A row's throughput with its interval, named by its kind, and whether a flag is on:
    `120.3 img/s (range 118.0-122.1)`."""
    text = f"{row['images_per_sec']:.1f} {_unit(row)}"
    interval = columns.cell(columns.column("images_per_sec_ci_low"), row, "html")
    flagged = FLAGGED if columns.flags_on(row) else ""
    return text + (f" ({interval})" if interval != "-" else "") + flagged


def _devices(row: Mapping[str, Any]) -> str:
    return columns.cell(columns.column("num_devices"), row, "html")


def _has_interval(row: Mapping[str, Any]) -> bool:
    return row.get("images_per_sec_ci_low") is not None \
        and row.get("images_per_sec_ci_high") is not None


def fastest(rows: list[dict[str, Any]], label: Any) -> str | None:
    """The fastest of rows (one device count's sound ok rows) and by how much; a winner is
    named only where its interval lies above every other row's; None without rows."""
    if not rows:
        return None
    ranked = sorted(rows, key=lambda r: r["images_per_sec"], reverse=True)
    top = ranked[0]
    head = f"{_devices(top)}: "
    if len(ranked) == 1:
        return head + f"{label(top)} {_figure(top)}, the only configuration that ran ok here"
    second = ranked[1]
    ratio = top["images_per_sec"] / second["images_per_sec"] \
        if second["images_per_sec"] else None
    both = f"{label(top)} {_figure(top)} against {label(second)} {_figure(second)}" + (
        f", {ratio:.2f}x" if ratio else "")
    if not all(_has_interval(r) for r in ranked):
        return head + f"{NO_INTERVAL}; {both}"
    if top["images_per_sec_ci_low"] <= max(r["images_per_sec_ci_high"] for r in ranked[1:]):
        return head + f"{NO_WINNER}; {both}"
    return head + (f"fastest {label(top)} {_figure(top)}, "
                   + (f"{ratio:.2f}x " if ratio else "") + f"the next, {label(second)} "
                   f"{_figure(second)}; the intervals do not overlap")


def _sound_scaling(row: Mapping[str, Any]) -> bool:
    return (row["num_devices"] > 1 and row.get("scaling_efficiency") is not None
            and not row.get("speedup_impossible") and not row.get("baseline_flags"))


def best_efficiency(rows: list[dict[str, Any]], label: Any) -> str | None:
    """The best scaling efficiency at the most devices any sound figure has (none flagged
    impossible or over a doubted baseline), and whether the next one lies within its
    interval; None where no multi-device row ran ok."""
    multi = [r for r in rows if r["num_devices"] > 1 and r.get("scaling_efficiency") is not None]
    sound = [r for r in multi if _sound_scaling(r)]
    if not sound:
        return ("scaling: no sound efficiency; every multi-device figure is flagged (below)"
                if multi else None)
    most = max(r["num_devices"] for r in sound)
    ranked = sorted((r for r in sound if r["num_devices"] == most),
                    key=lambda r: r["scaling_efficiency"], reverse=True)
    top = ranked[0]
    text = (f"best scaling efficiency at {_devices(top)}: {label(top)} "
            f"{top['scaling_efficiency']:.0%} (speedup {top['speedup']:.2f}x")
    low, high = top.get("efficiency_ci_low"), top.get("efficiency_ci_high")
    text += f", interval {low:.0%}-{high:.0%})" if low is not None and high is not None \
        else ", one run each: no interval)"
    text += FLAGGED if columns.flags_on(top) else ""
    if len(ranked) > 1:
        nxt = ranked[1]
        within = low is None or nxt["scaling_efficiency"] >= low
        text += (f"; {label(nxt)} {nxt['scaling_efficiency']:.0%} is "
                 + ("not told apart from it" if within else "below its interval"))
    return text


def least_memory(rows: list[dict[str, Any]], label: Any) -> str | None:
    """The least memory per device at the most devices any row measured it; None where no
    row did."""
    measured = [r for r in rows if r.get("memory_peak_bytes") is not None]
    if not measured:
        return None
    most = max(r["num_devices"] for r in measured)
    at = sorted((r for r in measured if r["num_devices"] == most),
                key=lambda r: r["memory_peak_bytes"])
    show = columns.column("memory_peak_bytes")
    text = (f"least memory per device at {_devices(at[0])}: {label(at[0])} "
            f"{columns.cell(show, at[0], 'html')}")
    if len(at) > 1:
        text += f" (next {label(at[1])} {columns.cell(show, at[1], 'html')})"
    else:
        text += " (the only configuration measured there)"
    if at[0].get("virtual_devices"):
        text += "; on virtual CPU devices this is the rank's process memory, not a device's"
    return text


def _short(meaning: str) -> str:
    """A flag's meaning up to its first colon or semicolon: what happened, not the advice."""
    cut = min((i for i in (meaning.find(": "), meaning.find("; ")) if i > 0),
              default=len(meaning))
    return meaning[:cut]


def troubles(rows: list[dict[str, Any]], records: list[dict[str, Any]],
             label: Any) -> list[str]:
    """The configurations that were not ok and why, those with a figure that is no result
    (trust.doubts) or another flag on, each with why, and the runs whose matmul peak is
    flagged implausible."""
    out = [f"{label(r)} on {_devices(r)}: {r['status']}: {r.get('reason') or 'no reason recorded'}"
           for r in rows if r["status"] != "ok"]
    explained: set[str] = set()  # a flag's meaning is given at its first mention only
    for r in rows:
        where = f"{label(r)} on {_devices(r)}"
        out += [f"{where}: not a result: {why}" for why in doubts(r).values()]
        other = [c for c in columns.flags_on(r) if c.key not in DOUBT_FLAGS]
        if other:
            out.append(f"{where}: flagged " + "; ".join(
                c.header + ("" if c.key in explained else f" ({_short(c.meaning)})")
                for c in other))
            explained.update(c.key for c in other)
    return out + implausible_peaks(records, label)


def implausible_peaks(records: list[dict[str, Any]], label: Any) -> list[str]:
    """One line per configuration whose MFU peak, or whose own framework's peak probe, the
    records flag `implausible` (bench/records/mfu.py implausibly_low)."""
    out: list[str] = []
    for rec in records:
        mfu = rec.get("mfu") if isinstance(rec.get("mfu"), Mapping) else {}
        used, own = (mfu.get(k) if isinstance(mfu.get(k), Mapping) else {}
                     for k in ("peak", "own_peak"))
        where = f"{label(rec)} on {_devices(rec)}"
        if used.get("implausible"):
            line = (f"{where}: MFU is no result: the peak it is taken against is implausible: "
                    f"{used['implausible']}")
        elif own.get("implausible"):
            line = (f"{where}: its own {own.get('family') or 'framework'} peak probe was "
                    f"implausible ({own['implausible']}); MFU is against the machine's best")
        else:
            continue
        if line not in out:
            out.append(line)
    return out


def _model(model: str, rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> Finding:
    """One model's sentences: the fastest per device count, scaling, memory, troubles."""
    label = _labeller(rows)
    sound = [r for r in rows if r["status"] == "ok" and r.get("images_per_sec") is not None
             and "throughput" not in doubts(r)]
    lines = [fastest([r for r in sound if r["num_devices"] == n], label)
             for n in sorted({r["num_devices"] for r in rows})]
    lines += [best_efficiency(sound, label), least_memory(sound, label)]
    lines += troubles(rows, [r for r in records if r.get("model") == model], label)
    return model, [line for line in lines if line]


def findings(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[Finding]:
    """The sweep's findings: a line on the sweep, then each model's (benchmark rows only:
    converge, pipeline and all-reduce runs have their own sections)."""
    bench = [r for r in rows if mode_of(r) == "benchmark"]
    if not bench:
        return []
    ok = sum(1 for r in bench if r["status"] == "ok")
    head = [f"{len(bench)} configurations, {ok} ok, {len(bench) - ok} not ok"]
    if any(r.get("virtual_devices") for r in bench):
        head.append("multi-device rows ran on virtual CPU devices sharing one host's cores: "
                    "they show the strategies work, not GPU scaling")
    models = dict.fromkeys(r["model"] for r in bench)
    return [("sweep", head)] + [
        _model(m, [r for r in bench if r["model"] == m],
               [r for r in records if mode_of(r) == "benchmark"]) for m in models]


def text(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """The findings for the terminal, each wrapped at TEXT_WIDTH under its heading; '' without
    benchmark rows."""
    found = findings(rows, records)
    if not found:
        return ""
    out = ["Findings (from the records; the table and its flags below):"]
    for heading, lines in found:
        out.append(f"  {heading}:")
        out += [textwrap.fill(line, TEXT_WIDTH, initial_indent="    - ",
                              subsequent_indent="      ") for line in lines]
    return "\n".join(out)
