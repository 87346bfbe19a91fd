"""Where the step's time went: one line a person can read for every summary row (runner,
configuration, device count), as far as the sweep's evidence allows.

A row's step is its global batch over its median images/sec (the estimator its efficiency is
from). It is split into:

- **compute**: the same configuration's 1-device step on synthetic data (its 1-device row;
  for a real-data row its synthetic twin's, which has no input in it, where the sweep ran
  one), times the row's per-device batch over the 1-device batch (strong scaling splits the
  batch);
- **communication**: a ring all-reduce of the model's gradient bytes at the bus bandwidth the
  sweep's own all-reduce probe measured (records of mode allreduce; bench/analysis/predict.py picks
  the
  probe and the model), without overlap: the most the all-reduce can add. Without a probe in
  the sweep it stays in the rest, and the line says so;
- **input**: a real-data row's time beyond its synthetic twin's (real_vs_synthetic below 1);
  none on synthetic data;
- **unexplained**: what is left; never printed negative: where the terms exceed the step the
  line says they overlap (the all-reduce estimate is an upper bound), and where the compute
  term alone exceeds it (the baseline ran slower than the whole: a speedup above the device
  count) the line says the split is not meaningful and splits nothing.

The GPUs' idle share from the telemetry (1 - their mean utilisation in the timed window) is
given beside, as a check: it is time the GPUs waited for communication, input or the host,
and overlaps those terms rather than adding to them. CPU runs have no GPU telemetry; their
busy cores are given instead.
"""

from __future__ import annotations

import html
from typing import Any

from bench.analysis.converge import explain_lines
from bench.analysis.predict import communication, probe_bandwidth, probe_records
from bench.records.grouping import baseline_key, config_key, mode_of, runner_label, synthetic_key
from contract.collectives import gradient_bytes

HEADING = "Where the time went"
# A row whose compute term (the 1-device step) is longer than its whole step: a speedup above
# the device count; no share of it is printed, a negative one least of all.
NOT_MEANINGFUL = ("the baseline ran slower than the whole (a speedup above the device "
                  "count), so no share is left for communication, input or the rest")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if abs(seconds) < 1 else f"{seconds:.3g} s"


def _share(part: float, whole: float) -> str:
    share = part / whole
    return f"{share:.1%}" if 0 < abs(share) < 0.01 else f"{share:.0%}"


def _step(row: dict[str, Any]) -> float | None:
    ips = row.get("images_per_sec")
    return row["global_batch_size"] / ips if ips else None


def _label(row: dict[str, Any]) -> str:
    batch = (f"{row['batch_size_per_device']}/dev" if row["scaling"] == "weak"
             else f"{row['global_batch_size']} global")
    nodes = row.get("num_nodes") or 1
    kind = "virtual CPU" if row.get("virtual_devices") else row.get("device", "")
    devices = (f"{nodes}x{row['num_devices'] // nodes}" if nodes > 1
               else str(row["num_devices"]))
    return (f"{runner_label(row)} {row['model']} {row['data_label']} {row['precision']} "
            f"b={batch}, {devices} {kind}")


def explain_row(row: dict[str, Any], rows_by_key: dict[tuple[Any, ...], dict[str, Any]],
                probes: list[dict[str, Any]]) -> str:
    """One summary row's line: its step split into compute, communication, input and the
    unexplained rest, with the GPUs' idle share beside."""
    label = _label(row)
    step = _step(row)
    if step is None:
        return f"{label}: not measured ({row.get('status')}: {row.get('reason') or '-'})"
    terms = [_compute(row, rows_by_key, step), _communication(row, probes, step),
             _input(row, step)]
    if terms[0][1] > step * (1 + 1e-9):
        return (f"{label}: step {_ms(step)}; split not meaningful: the compute term, the "
                f"1-device step ({_ms(terms[0][1])}), is longer than this whole step: "
                f"{NOT_MEANINGFUL}; {_idle(row, step)}")
    parts = [text for text, _ in terms]
    rest = step - sum(seconds for _, seconds in terms)
    rest = 0.0 if abs(rest) < 1e-9 * step else rest  # the 1-device row's own step
    parts.append(f"unexplained {_ms(rest)} ({_share(rest, step)})" if rest >= 0 else
                 f"unexplained none: the terms overlap by {_ms(-rest)} (communication, an "
                 "upper bound, or input hidden behind compute)")
    return f"{label}: step {_ms(step)} = " + " + ".join(parts) + f"; {_idle(row, step)}"


def _compute(row: dict[str, Any], rows_by_key: dict[tuple[Any, ...], dict[str, Any]],
             step: float) -> tuple[str, float]:
    """The compute term and its seconds: the 1-device step on synthetic data (no input
    pipeline in it), else this configuration's own 1-device step."""
    synthetic = rows_by_key.get((*synthetic_key(row)[:-2], 1, 1))
    own = rows_by_key.get(baseline_key(row))
    base = synthetic if synthetic and _step(synthetic) else own
    base_step = _step(base) if base else None
    if base is None or base_step is None:
        return "compute: no 1-device run of this configuration", 0.0
    compute = base_step * row["batch_size_per_device"] / base["batch_size_per_device"]
    how = ("the 1-device step" + (" on synthetic data" if base is not own else "")
           + ("" if row["scaling"] == "weak" else
              f" x {row['batch_size_per_device']}/{base['batch_size_per_device']} of "
              "the batch"))
    if row["data"] == "real" and base is own:
        how += ", real data: its input is in it"
    if row["num_devices"] > 1 and row.get("virtual_devices"):
        how += "; N virtual devices share the host's cores, so the rest is mostly that"
    return f"compute {_ms(compute)} ({_share(compute, step)}, {how})", compute


def _communication(row: dict[str, Any], probes: list[dict[str, Any]],
                   step: float) -> tuple[str, float]:
    """The communication term and its seconds: the gradients' ring all-reduce on the
    sweep's probed links (0 on one device; unknown without a probe or a gradient size)."""
    n = row["num_devices"]
    if n == 1:
        return "communication 0 (1 device)", 0.0
    try:
        nbytes = gradient_bytes(row["model"])
    except KeyError:
        nbytes = None
    bw = probe_bandwidth(probes, row["runner"], row["device"], n, nbytes) if (
        nbytes and probes) else None
    if nbytes is None or bw is None:
        why = ("no probe in this sweep: run mode: allreduce" if nbytes else
               f"no gradient size for model {row['model']!r}")
        return f"communication ? ({why}; it is in the rest)", 0.0
    comm = communication(nbytes, n, bw)[0]
    return (f"communication up to {_ms(comm)} ({_share(comm, step)}; ring "
            f"all-reduce of {nbytes / 1e6:.3g} MB, {bw.source})"), comm


def _input(row: dict[str, Any], step: float) -> tuple[str, float]:
    """The input term and its seconds: real data's loss against its synthetic twin."""
    ratio = row.get("real_vs_synthetic")
    if row["data"] != "real":
        return "input 0 (synthetic data)", 0.0
    if ratio is None:
        return "input: no synthetic twin to compare with", 0.0
    spent = max(0.0, step * (1 - ratio))
    return (f"input {_ms(spent)} ({_share(spent, step)}; real data at "
            f"{ratio:.0%} of synthetic)"), spent


def _idle(row: dict[str, Any], step: float) -> str:
    """What the devices did beside: the GPUs' idle share, else the CPU cores kept busy."""
    util = row.get("gpu_util_pct")
    if util is not None:
        idle = max(0.0, 1 - util / 100)
        why = "; HOST-BOUND: one host thread busy throughout" if row.get("host_bound") else ""
        return f"GPUs idle {idle:.0%} of the window (~{_ms(idle * step)} a step){why}"
    if row.get("run_cpu_cores") is not None:
        return f"no GPU telemetry; the run kept {row['run_cpu_cores']:.2g} CPU cores busy"
    return "no utilisation telemetry"


def explain(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[str]:
    """One line per benchmark summary row (bench.analysis.stats.summarise), in the summary's order;
    records are the folder's (its all-reduce probes give the communication term)."""
    mine = [r for r in rows if mode_of(r) == "benchmark"]
    by_key = {config_key(r): r for r in mine}
    probes = probe_records(records)
    return [explain_row(r, by_key, probes) for r in mine]


def text(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """The lines under a heading, for the terminal ('' when there is no benchmark or converge
    row): where a benchmark row's step went, where a converge row's time to target went
    (bench.analysis.converge.explain_lines)."""
    lines = explain(rows, records) + explain_lines(records)
    return "\n".join([f"{HEADING}:", *(f"  {line}" for line in lines)]) if lines else ""


def html_section(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """report.html's section: the heading, what the terms mean, a list item per row."""
    lines = explain(rows, records) + explain_lines(records)
    if not lines:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (f"<h2>{HEADING}</h2><p>Each row's step (global batch / img/s) split into compute "
            "(the same configuration's 1-device step, on synthetic data where the sweep ran "
            "it), communication (a ring all-reduce of "
            "the model's gradients at the bus bandwidth this sweep's all-reduce probe "
            "measured, without overlap: an upper bound), input (real data beyond its "
            "synthetic twin) and the unexplained rest; the GPUs' idle share from the "
            "telemetry is a check beside it, not a further term. Where the compute term "
            "alone exceeds the step (a speedup above the device count) the split is not "
            "meaningful and none is given.</p>"
            f"<ul>{items}</ul>")
