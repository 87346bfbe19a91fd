"""The communication probe's outputs (mode: allreduce): allreduce.csv, the terminal table, the
busbw chart and report.html's "All-reduce probe" section, from the sweep's allreduce records.

A probe record (bench/run/launch.py validates it; contract/collectives.py says what it holds) keeps
its figures under record["result"]["allreduce"]: `sizes` (one row per buffer size: bytes,
time_s, algbw_gbps, busbw_gbps, correct), and `busbw_gbps`, `algbw_gbps`, `time_s` at the
model's gradient size. Bandwidths are nccl-tests' (GB/s = 1e9 bytes/s; busbw = algbw x
2(n-1)/n), shown beside the nominal bandwidth of the box's slowest GPU-to-GPU link that
bench.analysis.interconnects reads from the sweep's environment.json (none on CPU).
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.analysis import interconnects
from bench.plotting import IDEAL, pyplot, save, series_style
from bench.records.store import load_records, read_environment
from bench.text_table import aligned
from contract.collectives import ALL_REDUCE, COLLECTIVES

CSV_NAME, CHART_NAME = "allreduce.csv", "allreduce.png"
NO_GPU = "no GPU: nominal link n/a"
ALLREDUCE_FIELDS = (
    "probe", "collective", "family", "model", "device", "num_devices", "virtual_devices",
    "implementation",
    "bytes", "mib", "gradient_size", "status", "runs_ok", "runs_total", "time_us",
    "algbw_gbps", "busbw_gbps", "busbw_gbps_min", "busbw_gbps_max", "nominal_link",
    "nominal_gbps", "busbw_of_nominal", "contended", "reason",
)


def is_allreduce(rec: dict[str, Any]) -> bool:
    return rec.get("mode") == "allreduce"


def _probe(rec: dict[str, Any]) -> dict[str, Any]:
    return (rec.get("result") or {}).get("allreduce") or {}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def nominal(results_dir: Path, records: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """bench.analysis.interconnects.nominal_link of the sweep's environment.json (else a record's
    environment): {"link", "nominal_gbps", "how"}."""
    env = read_environment(Path(results_dir))[0]  # None where missing or damaged
    if env is None:
        env = next((r.get("environment") for r in records or [] if r.get("environment")), {})
    return interconnects.nominal_link(env if isinstance(env, dict) else {})


def link_text(link: dict[str, Any]) -> str:
    """The nominal link in one phrase: its name and GB/s, or why there is none."""
    if link.get("nominal_gbps") is None:
        return NO_GPU if link.get("how", "").startswith("no GPU") else \
            f"nominal link unknown ({link.get('how')})"
    return f"{link['link']}: {link['nominal_gbps']:g} GB/s nominal ({link['how']})"


def sections(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A probe record's sections by collective: all_reduce (the `allreduce` section) and,
    since issue 27, the `collectives` beside it (all_gather, reduce_scatter: measured, or
    unavailable with the framework's reason); an older record has the all-reduce only."""
    result = rec.get("result") or {}
    out = {ALL_REDUCE: _probe(rec)}
    extra = result.get("collectives")
    if isinstance(extra, dict):
        out.update({k: v for k, v in extra.items() if k in COLLECTIVES and isinstance(v, dict)})
    return out


def summarise_allreduce(records: list[dict[str, Any]],
                        link: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per probe, collective, model, device kind, device count and buffer size: the
    median over the ok repeats of the time (in microseconds, as nccl-tests prints it), algbw
    and busbw (busbw's least and greatest beside it), and the nominal link's figure; a
    configuration with no ok run is one row without a size, with its status and reason, and
    so is a collective the framework does not have (status unavailable, its reason)."""
    link = link or {}
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if is_allreduce(rec):
            groups[(rec["runner"], rec["model"], rec["device"], rec["num_devices"])].append(rec)
    rows = []
    for key, recs in groups.items():
        ok = [r for r in recs if r["status"] == "ok"]
        base = _configuration(key, recs, ok, link)
        if not ok:
            rows.append(_blank(base))
            continue
        for name in [c for c in COLLECTIVES if any(c in sections(r) for r in ok)]:
            rows.extend(_collective_rows(base, name, [sections(r).get(name) or {} for r in ok]))
    order = {c: i for i, c in enumerate(COLLECTIVES)}
    rows.sort(key=lambda r: (r["model"], r["probe"], r["num_devices"],
                             order.get(r["collective"], 9), r["bytes"] or 0))
    return rows


def _blank(row: dict[str, Any]) -> dict[str, Any]:
    """row with every other ALLREDUCE_FIELDS None (a row without measured sizes)."""
    return {**row, **{k: None for k in ALLREDUCE_FIELDS if k not in row}}


def _configuration(key: tuple[Any, ...], recs: list[dict[str, Any]], ok: list[dict[str, Any]],
                   link: dict[str, Any]) -> dict[str, Any]:
    """What every row of one probe configuration (probe, model, device, count) says."""
    probe, model, device, n = key
    first = (ok or recs)[0]
    return {
        "probe": probe, "collective": ALL_REDUCE, "family": first.get("family"),
        "model": model, "device": device,
        "num_devices": n, "virtual_devices": first.get("virtual_devices"),
        "implementation": None,
        "status": "ok" if ok else "/".join(sorted({r["status"] for r in recs})),
        "runs_ok": len(ok), "runs_total": len(recs),
        # other processes shared some ok run's window (bench/run/telemetry.py's contention)
        "contended": any(bool(r.get("contended")) for r in ok),
        # a link between GPUs is nothing to hold CPU devices' figures against
        "nominal_link": link.get("link") if device == "gpu" else None,
        "nominal_gbps": link.get("nominal_gbps") if device == "gpu" else None,
        "reason": next((r["reason"] for r in recs if r.get("reason")), None),
    }


def _collective_rows(base: dict[str, Any], name: str,
                     secs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One collective's rows over the ok repeats' sections `secs`: a row per buffer size with
    the medians, or one row with the status and reason where none measured it."""
    measured_secs = [x for x in secs if x.get("sizes")]
    crow = {**base, "collective": name,
            "implementation": next((x.get("implementation") for x in measured_secs), None)}
    if not measured_secs:
        crow.update(status=next((x.get("status") for x in secs if x.get("status")), "missing"),
                    reason=next((x.get("reason") for x in secs if x.get("reason")), None))
        return [_blank(crow)]
    by_size: dict[int, list[dict[str, Any]]] = defaultdict(list)
    top = None
    for sec in measured_secs:
        top = sec.get("gradient_bytes", top)
        for row in sec["sizes"]:
            by_size[row["bytes"]].append(row)
    rows = []
    for size, measured in sorted(by_size.items()):
        bus = [m["busbw_gbps"] for m in measured]
        busbw = _median(bus)
        nom = base["nominal_gbps"]
        rows.append({
            **crow, "bytes": size, "mib": size / 2**20, "gradient_size": size == top,
            "time_us": _median([m["time_s"] * 1e6 for m in measured]),
            "algbw_gbps": _median([m["algbw_gbps"] for m in measured]),
            "busbw_gbps": busbw, "busbw_gbps_min": min(bus), "busbw_gbps_max": max(bus),
            "busbw_of_nominal": busbw / nom if nom and busbw is not None else None,
        })
    return rows


def at_gradient_size(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The row of each configuration at its model's gradient size (or its not-ok row)."""
    return [r for r in rows if r["gradient_size"] or r["bytes"] is None]


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def _devices(r: dict[str, Any]) -> str:
    return f"{r['num_devices']} {'vcpu' if r['virtual_devices'] else r['device']}"


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    return (r["probe"], r["collective"], r["model"], _devices(r), r["implementation"] or "-",
            _num(r["mib"], ".1f"), _num(r["time_us"] and r["time_us"] / 1e3, ".2f"),
            _num(r["algbw_gbps"], ".2f"), _num(r["busbw_gbps"], ".2f"),
            _num(r["busbw_of_nominal"], ".0%"), r["status"],
            "CONTENDED" if r["contended"] else "-")


HEAD = ("probe", "collective", "model", "devices", "implementation", "MiB", "time ms", "algbw GB/s",
        "busbw GB/s", "of nominal", "status", "flags")


def format_allreduce_table(rows: list[dict[str, Any]], link: dict[str, Any]) -> str:
    """The terminal table: each probe, model and device count at the model's gradient size,
    the nominal link under it, and the reasons of configurations not ok."""
    top = at_gradient_size(rows)
    out = aligned([HEAD, *(_cells(r) for r in top)])
    reasons = [f"  {r['probe']} {r['collective']} {r['model']} n={r['num_devices']}: "
               f"{r['reason']}"
               for r in top if r["status"] != "ok" and r.get("reason")]
    virtual = any(r["virtual_devices"] for r in top)
    return "\n".join(
        ["All-reduce probe (mode: allreduce), at each model's gradient size; algbw = bytes / "
         "time, busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and "
         "reduce_scatter (nccl-tests; their bytes: the gathered / scattered total), "
         "GB/s = 1e9 bytes/s:", *out, "",
         f"nominal link: {link_text(link)}"]
        + (["virtual CPU devices: the ranks share one host's memory; busbw is no link's "
            "figure"] if virtual else [])
        + (["CONTENDED: other processes shared the machine (CPU or a GPU) in the timed window"]
           if any(r["contended"] for r in top) else [])
        + ([f"per size: {CSV_NAME}"] if top else [])
        + (["", "Not ok:", *reasons] if reasons else []))


def render_allreduce_chart(results_dir: Path, rows: list[dict[str, Any]],
                           link: dict[str, Any]) -> Path | None:
    """busbw against the buffer size (log scale) per probe and device count, one panel per
    model, the nominal link as a horizontal line where the capture names one."""
    ok = [r for r in rows if r["busbw_gbps"] is not None]
    if not ok:
        return None
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    models = sorted({r["model"] for r in ok})
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        series: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
        for r in ok:
            if r["model"] == model:
                series[(r["probe"], r["collective"], r["num_devices"])].append(r)
        for i, ((probe, name, n), pts) in enumerate(sorted(series.items())):
            pts.sort(key=lambda r: r["bytes"])
            ax.plot([p["mib"] for p in pts], [p["busbw_gbps"] for p in pts],
                    **series_style(i),
                    label=f"{probe} n={n}" + ("" if name == ALL_REDUCE else f" {name}"))
        if link.get("nominal_gbps") is not None:
            ax.axhline(link["nominal_gbps"], **IDEAL,
                       label=f"nominal {link['link']} ({link['nominal_gbps']:g} GB/s)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        top = next((p["mib"] for p in ok if p["model"] == model and p["gradient_size"]
                    and p["collective"] == ALL_REDUCE), None)
        if top is not None:
            ax.axvline(top, color="black", alpha=0.2)
        ax.set_title(f"{model} (gradient size {_num(top, '.1f')} MiB)")
        ax.set_xlabel("buffer size (MiB, log scale)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    virtual = any(r["virtual_devices"] for r in ok)
    fig.suptitle("Collectives' bus bandwidth (nccl-tests' busbw) vs buffer size"
                 + ("\nvirtual CPU devices: one host's memory; " + NO_GPU if virtual
                    else "" if link.get("nominal_gbps") is not None
                    else f"\n{link_text(link)}"), fontsize=10)

    return save(fig, Path(results_dir) / "charts" / CHART_NAME, plt)


def rows_and_link(results_dir: Path, records: list[dict[str, Any]]
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A results folder's probe rows (allreduce.csv's; none without probe records) and the
    nominal link of its environment (none when no probe ran on GPUs)."""
    probes = [r for r in records if is_allreduce(r)]
    link = nominal(results_dir, probes)
    if not any(r.get("device") == "gpu" for r in probes):
        link = {"link": None, "nominal_gbps": None,
                "how": "no GPU in the probe's runs: they ran on CPU devices"}
    return summarise_allreduce(probes, link), link


def allreduce_table(results_dir: Path,
                    records: list[dict[str, Any]] | None = None) -> str | None:
    """The terminal table of a results folder's probe records (read from the folder unless
    given), or None without any."""
    if records is None:
        records = load_records(Path(results_dir))
    rows, link = rows_and_link(results_dir, records)
    return format_allreduce_table(rows, link) if rows else None


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def html_section(results_dir: Path, records: list[dict[str, Any]]) -> str:
    """report.html's "All-reduce probe" section ("" without probe records): what the figures
    are, the nominal link, the table at the gradient size and, folded, every size."""
    rows, link = rows_and_link(results_dir, records)
    if not rows:
        return ""

    def table(sel: list[dict[str, Any]]) -> str:
        th = "".join(f"<th>{_e(h)}</th>" for h in HEAD)
        body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in _cells(r)) + "</tr>"
                       for r in sel)
        return f"<table><tr>{th}</tr>{body}</table>"

    reasons = "".join(f"<li>{_e(r['probe'])} {_e(r['collective'])} {_e(r['model'])} "
                      f"n={r['num_devices']}: "
                      f"{_e(r['reason'])}</li>" for r in at_gradient_size(rows)
                      if r["status"] != "ok" and r.get("reason"))
    return "".join([
        "<h2>All-reduce probe</h2>",
        "<p>Each family's own all-reduce (sum, float32) alone, and its all-gather and "
        "reduce-scatter where the framework has them, over buffers from 1 MiB to the "
        "model's gradient size, timed as nccl-tests does (warm-up, a barrier, the timed calls "
        "back to back, the mean time over the ranks). algbw = bytes / time; busbw = algbw x "
        "2(n-1)/n for the all-reduce and x (n-1)/n for all-gather and reduce-scatter (whose "
        "bytes are the whole gathered / scattered buffer, n x one rank's part), comparable "
        "to one link's bandwidth whatever the device count. GB/s are 1e9 bytes/s. Every "
        "size's result was checked (sums against n(n+1)/2, a gather's parts in rank order). "
        "Chart: "
        f'<a href="charts/{CHART_NAME}">{CHART_NAME}</a>; every size: {CSV_NAME}.</p>',
        f"<p><b>Nominal link:</b> {_e(link_text(link))}</p>",
        table(at_gradient_size(rows)),
        f"<ul>{reasons}</ul>" if reasons else "",
        "<details><summary>every buffer size</summary>",
        table([r for r in rows if r["bytes"] is not None]), "</details>",
    ])
