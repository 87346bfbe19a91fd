"""The sweep's charts (matplotlib, PNG, in results/<sweep>/charts/): one chart per question.

- throughput.png: images/sec against the device count, each series' ideal (its 1-device
  figure x devices) dashed;
- speedup.png: images/sec over the same configuration's 1-device figure, ideal y = x;
- efficiency.png: speedup / devices in percent, ideal 100%;
- memory_per_device.png: the memory one device held, where the records have it;
and beside them largest_device_count.png (every configuration at the largest count),
tokens_per_sec.png (token models), real_vs_synthetic.png and pipelines.png.

Every chart fits its axes to the measured data: linear from zero unless the measured values
span decades. Published figures (bench/analysis/published.py draw_published) are drawn where
they fall within 3x of the measured range and marked on the axis edge, with their value in
text, where they do not. A sweep on virtual CPU devices says so in the title. Series differ in
marker and line style as well as colour (bench/plotting.py), so a greyscale print reads.
Each figure is built by a *_figure function that returns it unsaved (the tests read its Axes);
the render_* functions save them.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import plotting
from bench.analysis.published import draw_published
from bench.analysis.stats import BASELINE, INPUT_BOUND_RATIO
from bench.plotting import FLAGGED, FLAGGED_HATCH, IDEAL, pyplot, save, series_style, virtual_note
from bench.records.grouping import runner_label
from bench.records.trust import doubts

THROUGHPUT_CHART, SPEEDUP_CHART = "throughput.png", "speedup.png"
EFFICIENCY_CHART, MEMORY_CHART = "efficiency.png", "memory_per_device.png"
LARGEST_CHART, TOKENS_CHART = "largest_device_count.png", "tokens_per_sec.png"
REAL_CHART, PIPELINE_CHART = "real_vs_synthetic.png", "pipelines.png"
# The charts render_charts always writes for a sweep with benchmark rows.
CHARTS = (THROUGHPUT_CHART, SPEEDUP_CHART, EFFICIENCY_CHART, LARGEST_CHART)
# One chart per question; memory only where the records have it.
QUESTION_CHARTS = (THROUGHPUT_CHART, SPEEDUP_CHART, EFFICIENCY_CHART, MEMORY_CHART)
DECADES = 100.0  # measured max/min from which a y axis is logarithmic
HEADROOM = 1.08  # above the highest measured point (its error bar included)
LEGEND_WIDTH = 44  # characters of a legend line
INTERVALS = {"range": "min-max range", "95% bootstrap CI": "95% bootstrap CI"}
# Which of a row's doubts (bench/records/trust.py) make its point on a chart of a key no result:
# a speedup or efficiency over a suspect baseline or above the device count; a throughput
# above the compute bound, or one the impossible speedup came from.
CHART_DOUBTS = {"speedup": ("speedup", "baseline"), "scaling_efficiency": ("speedup", "baseline"),
                "images_per_sec": ("speedup", "throughput"),
                "tokens_per_sec": ("speedup", "throughput")}
FLAGGED_LABEL = "large white marker, ?: flagged, not a result (caption)"

Row = dict[str, Any]


def render_charts(results_dir: Path, rows: list[Row]) -> list[Path]:
    """throughput.png, speedup.png, efficiency.png and largest_device_count.png; none (and
    an earlier report's removed) when no row has a figure: empty axes answer nothing."""
    out = Path(results_dir) / "charts"
    figures = ((THROUGHPUT_CHART, throughput_figure), (SPEEDUP_CHART, speedup_figure),
               (EFFICIENCY_CHART, efficiency_figure), (LARGEST_CHART, largest_figure))
    if not any(r.get("images_per_sec") is not None for r in rows):
        for name, _ in figures:
            _remove_stale(out / name)
        return []
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    return [save(build(rows), out / name, plt) for name, build in figures]


def render_memory_chart(results_dir: Path, rows: list[Row]) -> Path | None:
    """memory_per_device.png; None when no row has memory."""
    return _render(results_dir, MEMORY_CHART, memory_figure(rows))


def render_tokens_chart(results_dir: Path, rows: list[Row]) -> Path | None:
    """tokens_per_sec.png; None without token models."""
    return _render(results_dir, TOKENS_CHART, tokens_figure(rows))


def render_real_chart(results_dir: Path, rows: list[Row]) -> Path | None:
    """real_vs_synthetic.png; None without real-data rows."""
    return _render(results_dir, REAL_CHART, real_figure(rows))


def render_pipeline_chart(results_dir: Path, rows: list[Row]) -> Path | None:
    """pipelines.png from the pipeline rows; None without an ok one."""
    return _render(results_dir, PIPELINE_CHART, pipeline_figure(rows))


def _render(results_dir: Path, name: str, fig: Any) -> Path | None:
    """The figure saved as charts/<name>; None (an earlier report's file removed: a report
    of a changed folder shows no chart of records it no longer has) without one."""
    path = Path(results_dir) / "charts" / name
    if fig is None:
        _remove_stale(path)
        return None
    return save(fig, path, pyplot())


def _remove_stale(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@dataclass(frozen=True)
class DeviceChart:
    """What a chart against the device count draws: the row `key` (times `scale`), its
    labels, `ideal` "series" (each series' 1-device figure x devices), "diagonal" (y =
    devices) or "flat" (100%), `published` the published value drawn beside, `state` the
    model state per device hollow beside each series."""

    key: str
    ylabel: str
    title: str
    ideal: str | None = None
    published: str | None = None
    scale: float = 1.0
    state: bool = False
    subtitle: str = ""


def throughput_figure(rows: list[Row], table: list[Row] | None = None) -> Any:
    """Images/sec against the device count, a panel per model, each series' ideal dashed
    and the published figures (`table`, default reference/published.csv) beside."""
    return _device_figure(rows, DeviceChart("images_per_sec", "images/sec",
                                            "Throughput vs device count", ideal="series",
                                            published="images_per_sec"), table)


def speedup_figure(rows: list[Row], table: list[Row] | None = None) -> Any:
    """Speedup over the same configuration's 1-device run, ideal y = x."""
    return _device_figure(rows, DeviceChart("speedup", "speedup over 1 device (x)",
                                            "Speedup vs 1 device", ideal="diagonal",
                                            published="speedup"), table)


def efficiency_figure(rows: list[Row], table: list[Row] | None = None) -> Any:
    """Scaling efficiency (speedup / devices) in percent, ideal 100%."""
    return _device_figure(rows, DeviceChart("scaling_efficiency", "scaling efficiency (%)",
                                            "Scaling efficiency (speedup / devices)",
                                            ideal="flat", published="scaling_efficiency",
                                            scale=100.0), table)


def tokens_figure(rows: list[Row]) -> Any:
    """Tokens/sec against the device count for the token models (their images/sec is
    samples/sec), each series' ideal dashed; None without them."""
    ok = [r for r in rows if r.get("tokens_per_sec") is not None]
    if not ok:
        return None
    return _device_figure(ok, DeviceChart("tokens_per_sec", "tokens/sec",
                                          "Token throughput vs device count", ideal="series",
                                          subtitle="tokens/sec = samples/sec x sequence length"))


def memory_figure(rows: list[Row]) -> Any:
    """The memory one device held (the most of any device of the run, the median over
    repeats) against the device count, a line per configuration; the model state
    (parameters, gradients, optimizer) per device as the same marker hollow on a thin line.
    None when no row has memory."""
    have = [r for r in rows if r.get("memory_peak_bytes") is not None]
    if not have:
        return None
    virtual = any(r["virtual_devices"] for r in have)
    return _device_figure(have, DeviceChart(
        "memory_peak_bytes", "GiB per device", "Memory per device vs device count",
        scale=1 / 2**30, state=True,
        subtitle="framework allocator's peak in the timed window; on CPU the process's peak "
                 "resident memory" + (", shared by its virtual devices" if virtual else "")))


def _device_figure(rows: list[Row], chart: DeviceChart, table: list[Row] | None = None) -> Any:
    """A panel per model of chart.key (x scale) against the device count, a line per series
    with its interval as error bars, the chart's ideal and published figures (`table`)."""
    key, scale, ideal = chart.key, chart.scale, chart.ideal
    plt = pyplot()
    ok = [r for r in rows if r.get(key) is not None]
    failed = failed_rows(rows)
    models = sorted({r["model"] for r in ok + failed}) or ["(no ok runs)"]
    series = _series(ok)
    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        mine = [r for r in ok if r["model"] == model]
        values = [r[key] * scale for r in mine]
        highs = [(r.get(f"{_ci(key)}_high") or r[key]) * scale for r in mine]
        drawn = _draw_series(ax, series, model, key, scale)
        _draw_flagged(ax, drawn, key, scale)
        lost = _draw_failed(ax, [r for r in failed if r["model"] == model])
        counts = sorted({r["num_devices"] for r in mine} | set(lost))
        if ideal == "series":
            for _, pts, line in drawn:
                base = next((p for p in pts if p["num_devices"] == 1), None)
                if base is not None:
                    ys = [base[key] * scale * p["num_devices"] for p in pts]
                    ax.plot([p["num_devices"] for p in pts], ys, **{**IDEAL,
                            "color": line.get_color()}, alpha=0.7, label="_ideal")
                    highs += ys
            if any(ln.get_label() == "_ideal" for ln in ax.get_lines()):
                ax.plot([], [], **IDEAL, label="ideal: 1-device figure x devices")
        elif ideal == "diagonal" and counts:
            ax.plot([counts[0], counts[-1]], [counts[0], counts[-1]], **IDEAL,
                    label="ideal (speedup = devices)")
            highs.append(counts[-1])
        elif ideal == "flat":
            ax.axhline(100.0, **IDEAL, label="ideal (100%)")
            highs.append(100.0)
        if chart.state:
            highs += _draw_state(ax, drawn, scale)
        _fit_y(ax, values, highs)
        if chart.published:
            draw_published(ax, model, ok, chart.published, scale=scale, table=table)
        _interval_caption(ax, mine, key)
        _axes(ax, model, _devices_label(mine), _rate_label(chart.ylabel, mine))
        if counts:
            ax.set_xticks(counts)
    fig.suptitle(chart.title + virtual_note(ok)
                 + (f"\n{textwrap.fill(chart.subtitle, 80 * len(models))}" if chart.subtitle
                    else ""))
    _flagged_caption(fig, ok, CHART_DOUBTS.get(key, ()), len(models), "large white marker",
                     failed)
    return fig


def chart_doubts(row: Row, kinds: tuple[str, ...]) -> list[str]:
    """The reasons (bench.records.trust.doubts) of a row's figure of these kinds."""
    return [why for kind, why in doubts(row).items() if kind in kinds]


def _draw_flagged(ax: Any, drawn: list[tuple[str, list[Row], Any]], key: str,
                  scale: float) -> None:
    """Over each flagged point (CHART_DOUBTS of key): the series' marker large and white
    inside (plotting.FLAGGED), its value with ? beside; a legend line says what they are."""
    kinds, any_flagged = CHART_DOUBTS.get(key, ()), False
    for _, pts, line in drawn:
        bad = [p for p in pts if chart_doubts(p, kinds)]
        if bad:
            ys = [p[key] * scale for p in bad]
            ax.plot([p["num_devices"] for p in bad], ys, marker=line.get_marker(),
                    markeredgecolor=line.get_color(), label="_flagged", **FLAGGED)
            for p, y in zip(bad, ys, strict=True):
                ax.annotate(f"{_value_text(key, y)}?", (p["num_devices"], y), fontsize=8,
                            xytext=(-8, 6), textcoords="offset points", ha="right",
                            color="#d62728")
            any_flagged = True
    if any_flagged:
        ax.plot([], [], color="black", marker="o", label=FLAGGED_LABEL, **FLAGGED)


def failed_rows(rows: list[Row]) -> list[Row]:
    """The configurations no run of which gave a figure because they failed (timeout, oom,
    failed, invalid; a planned `unavailable` never ran): charts mark them, never drop them."""
    return [r for r in rows if r.get("status") not in (None, "ok", "unavailable")
            and r.get("images_per_sec") is None]


def _draw_failed(ax: Any, rows: list[Row]) -> list[int]:
    """Each failed configuration as a red x on the panel's floor at its device count, its
    status beside; their device counts."""
    floor = ax.get_xaxis_transform()  # x in data, y in axes fractions
    for r in rows:
        ax.plot(r["num_devices"], 0.03, transform=floor, clip_on=False, label="_failed",
                **plotting.FAILED)
        ax.annotate(r["status"], (r["num_devices"], 0.03), xycoords=floor, fontsize=7,
                    xytext=(6, 3), textcoords="offset points", color=plotting.FAILED["color"])
    if rows:
        ax.plot([], [], label="x on the floor: failed, no figure (caption)", **plotting.FAILED)
    return [r["num_devices"] for r in rows]


def _value_text(key: str, value: float) -> str:
    return (f"{value:.2f}x" if key == "speedup" else f"{value:.0f}%"
            if key == "scaling_efficiency" else f"{value:.1f}")


def _flagged_caption(fig: Any, rows: list[Row], kinds: tuple[str, ...], panels: int,
                     drawn_as: str, failed: Sequence[Row] = ()) -> None:
    """The figure's caption (under it) naming each flagged point (`drawn_as`, its value
    with ?) and why, then each failed configuration and its status; none when neither."""
    lines = [f"{_series_label(r)}, {r['model']}, {r['num_devices']} devices: "
             + "; ".join(chart_doubts(r, kinds)) for r in rows if chart_doubts(r, kinds)]
    lost = [f"{_series_label(r)}, {r['model']}, {r['num_devices']} devices: {r['status']}"
            for r in failed]
    parts = ([f"Flagged ({drawn_as}, value with ?), not a result: " + " | ".join(lines)]
             if lines else []) + (["Failed, no figure: " + " | ".join(lost)] if lost else [])
    if parts:
        text = "\n".join(textwrap.fill(p, 110 * panels) for p in parts)
        fig.supxlabel(text, fontsize=7, color="#d62728")


def _ci(key: str) -> str:
    """The prefix of a value's interval fields (images_per_sec_ci_low, efficiency_ci_high)."""
    return {"scaling_efficiency": "efficiency_ci"}.get(key, f"{key}_ci")


def _series(ok: list[Row]) -> dict[tuple[str, str], list[Row]]:
    series: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in ok:
        for label in _series_labels(r, ok):
            series[(r["model"], label)].append(r)
    return series


def _draw_series(ax: Any, series: dict[tuple[str, str], list[Row]], model: str, key: str,
                 scale: float) -> list[tuple[str, list[Row], Any]]:
    """Each series of `model` against the device count in its own style, with its interval
    as error bars; (label, its points by device count, its line) of each."""
    drawn = []
    mine = sorted((label, pts) for (m, label), pts in series.items() if m == model)
    for i, (label, pts) in enumerate(mine):
        pts = sorted(pts, key=lambda r: r["num_devices"])
        xs = [p["num_devices"] for p in pts]
        line, = ax.plot(xs, [p[key] * scale for p in pts], **series_style(i), label=label)
        _error_bars(ax, xs, pts, key, scale, line.get_color())
        drawn.append((label, pts, line))
    return drawn


def _draw_state(ax: Any, drawn: list[tuple[str, list[Row], Any]], scale: float) -> list[float]:
    """Each series' model state per device: its marker hollow on a thin dotted line."""
    ys_all: list[float] = []
    for _, pts, line in drawn:
        have = [p for p in pts if p.get("model_state_bytes") is not None]
        if have:
            ys = [p["model_state_bytes"] * scale for p in have]
            ax.plot([p["num_devices"] for p in have], ys, color=line.get_color(),
                    marker=line.get_marker(), markerfacecolor="none", linestyle=":",
                    linewidth=0.8, label="_state")
            ys_all += ys
    if ys_all:
        ax.plot([], [], color="black", marker="o", markerfacecolor="none", linestyle=":",
                linewidth=0.8, label="hollow: model state (params + grads + optimizer)")
    return ys_all


def _error_bars(ax: Any, xs: list[int], pts: list[Row], key: str, scale: float,
                color: str) -> None:
    """A row's interval over repeats as an error bar, where it has one."""
    low, high = f"{_ci(key)}_low", f"{_ci(key)}_high"
    have = [(x, p) for x, p in zip(xs, pts, strict=True)
            if p.get(low) is not None and p.get(high) is not None]
    if have:
        ax.errorbar([x for x, _ in have], [p[key] * scale for _, p in have],
                    # a percentile interval need not hold the point: clip, never negative
                    yerr=[[max(0.0, (p[key] - p[low]) * scale) for _, p in have],
                          [max(0.0, (p[high] - p[key]) * scale) for _, p in have]],
                    fmt="none", ecolor=color, capsize=3, alpha=0.8)


def _interval_caption(ax: Any, rows: list[Row], key: str) -> None:
    """A legend line naming what the error bars are ("error bars: 95% bootstrap CI (3
    repeats)"), from the rows' `interval`; none where no row says."""
    kinds: dict[str, set[int]] = defaultdict(set)
    # a ratio to the 1-device run has the interval of the side with fewer runs
    field = "speedup_interval" if key in ("speedup", "scaling_efficiency") else "interval"
    for r in rows:
        kind = INTERVALS.get(r.get(field) or r.get("interval") or "")
        if kind and r.get(f"{_ci(key)}_low") is not None:
            kinds[kind].add(r.get("runs_ok") or 0)
    if not kinds:
        return
    parts = []
    for kind, runs in sorted(kinds.items()):
        n = sorted(k for k in runs if k)
        reps = "" if not n else f" ({n[0]} repeats)" if len(n) == 1 \
            else f" ({n[0]}-{n[-1]} repeats)"
        parts.append(kind + reps)
    ax.plot([], [], color="black", marker="|", markersize=10, linestyle="none",
            label="error bars: " + "; ".join(parts))


def _fit_y(ax: Any, values: list[float], highs: list[float]) -> None:
    """The y axis fitted to the measured values (highs: their error bars and ideal lines):
    linear from zero, or logarithmic where the values span DECADES."""
    positive = [v for v in values if v > 0]
    top = max([*values, *highs], default=1.0) or 1.0
    if positive and max(positive) / min(positive) >= DECADES:
        ax.set_yscale("log")
        ax.set_ylim(min(positive) / HEADROOM, top * HEADROOM)
    else:
        ax.set_ylim(0, top * HEADROOM)


def _rate_label(label: str, rows: list[Row]) -> str:
    """A panel's images/sec axis named samples/sec where its model takes tokens (its samples
    are sequences; tokens/sec is its own chart)."""
    if label == "images/sec" and any(r.get("tokens_per_sec") is not None for r in rows):
        return "samples/sec (sequences)"
    return label


def _devices_label(rows: list[Row]) -> str:
    return "virtual CPU devices" if any(r["virtual_devices"] for r in rows) else "devices"


def largest_figure(rows: list[Row]) -> Any:
    """Every configuration's images/sec at its model's largest device count, as bars; one that
    failed there an empty bar with its status (charts/_draw_failed's red)."""
    plt = pyplot()
    ok = [r for r in rows if r["images_per_sec"] is not None]
    shown = ok + failed_rows(rows)
    models = sorted({r["model"] for r in shown}) or ["(no ok runs)"]
    fig, axes = _subplots(plt, len(models))
    tops = {m: max(r["num_devices"] for r in shown if r["model"] == m) for m in
            {r["model"] for r in shown}}
    kinds = CHART_DOUBTS["images_per_sec"]
    for ax, model in zip(axes, models, strict=False):
        mine = [r for r in shown if r["model"] == model]
        bars = [r for r in mine if r["num_devices"] == tops.get(model)]
        _bars(ax, bars, kinds)
        devices = _devices_label(mine)
        top = tops.get(model, 0)
        _axes(ax, f"{model}: {top} {devices[:-1] if top == 1 else devices}", "",
              _rate_label("images/sec", mine))
        _fit_y(ax, [], [r["images_per_sec"] or 0.0 for r in bars] or [1.0])
        ax.set_ylim(0, ax.get_ylim()[1] * 1.06)  # the bars' labels
    fig.suptitle("All configurations at the largest device count" + virtual_note(ok))
    at_top = [r for r in shown if r["num_devices"] == tops[r["model"]]]
    _flagged_caption(fig, [r for r in at_top if r["images_per_sec"] is not None], kinds,
                     len(models), "hatched bar", [r for r in at_top if r["images_per_sec"] is None])
    return fig


def _bars(ax: Any, bars: list[Row], kinds: tuple[str, ...]) -> None:
    """One bar per configuration (hatched when flagged; a failed one empty, its status in
    red as its label)."""
    heights = [r["images_per_sec"] or 0.0 for r in bars]
    drawn = ax.bar(range(len(bars)), heights, color="#1f77b4", edgecolor="black",
                   linewidth=0.6,
                   hatch=[FLAGGED_HATCH if chart_doubts(r, kinds) else "" for r in bars])
    labels = ax.bar_label(drawn, [
        f"{r['status']}: no figure" if r["images_per_sec"] is None else
        f"{r['images_per_sec']:.1f}" + ("?" if chart_doubts(r, kinds) else "") for r in bars],
        fontsize=8)
    for label, r in zip(labels, bars, strict=True):
        if r["images_per_sec"] is None:
            label.set_color(plotting.FAILED["color"])
    ax.set_xlim(-0.75, max(len(bars), 4) - 0.25)  # a lone bar is not the panel's width
    ax.set_xticks(range(len(bars)), [_series_label(r) for r in bars], rotation=30,
                  ha="right", fontsize=8)


def real_figure(rows: list[Row]) -> Any:
    """Synthetic vs real-data throughput per runner and device count, input-bound marked
    (hatched and labelled, not only red); None without real-data rows."""
    real = [r for r in rows if r["real_vs_synthetic"] is not None]
    if not real:
        return None
    plt = pyplot()
    models = sorted({r["model"] for r in real})
    fig, axes = plt.subplots(1, len(models), figsize=(max(6.5, 1.2 * len(real)) * len(models),
                                                      4.8), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        mine = sorted((r for r in real if r["model"] == model),
                      key=lambda r: (runner_label(r), r["num_devices"], r["data_label"]))
        xs = range(len(mine))
        syn = [r["images_per_sec"] / r["real_vs_synthetic"] for r in mine]
        ax.bar([x - 0.2 for x in xs], syn, 0.4, label="synthetic", color="#bbbbbb",
               edgecolor="black", linewidth=0.6)
        bars = ax.bar([x + 0.2 for x in xs], [r["images_per_sec"] for r in mine], 0.4,
                      label="real (hatched: input-bound)", edgecolor="black", linewidth=0.6,
                      color=["#d62728" if r["input_bound"] else "#1f77b4" for r in mine],
                      hatch=["//" if r["input_bound"] else "" for r in mine])
        ax.bar_label(bars, [f"{r['real_vs_synthetic']:.0%}" + ("\ninput-bound"
                                                               if r["input_bound"] else "")
                            for r in mine], fontsize=7)
        ax.set_xticks(list(xs), [f"{runner_label(r)}\nn={r['num_devices']} "
                                 f"w={r['loader_workers']}" for r in mine],
                      rotation=30, ha="right", fontsize=7)
        _fit_y(ax, [], [*syn, *(r["images_per_sec"] for r in mine)])
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # the bars' two-line labels
        _axes(ax, model, "", "images/sec")
    fig.suptitle("Real data vs synthetic (input-bound: below "
                 f"{INPUT_BOUND_RATIO:.0%} of synthetic)" + virtual_note(real))
    return fig


def pipeline_figure(rows: list[Row]) -> Any:
    """Each input pipeline's images/sec against its worker count, the naive loop as a line;
    None without an ok row."""
    ok = [r for r in rows if r["images_per_sec"] is not None]
    if not ok:
        return None
    plt = pyplot()
    models = sorted({r["model"] for r in ok})
    fig, axes = _subplots(plt, len(models))
    for ax, model in zip(axes, models, strict=False):
        mine = [r for r in ok if r["model"] == model]
        for r in (r for r in mine if r["pipeline"] == BASELINE):
            ax.axhline(r["images_per_sec"], **IDEAL,
                       label=f"{BASELINE} (1 process) b={r['batch']}")
        series: dict[tuple[str, int], list[Row]] = defaultdict(list)
        for r in mine:
            if r["pipeline"] != BASELINE:
                series[(r["pipeline"], r["batch"])].append(r)
        for i, ((name, batch), pts) in enumerate(sorted(series.items())):
            pts.sort(key=lambda r: r["loader_workers"])
            ax.plot([p["loader_workers"] for p in pts], [p["images_per_sec"] for p in pts],
                    **series_style(i), label=f"{name} b={batch}")
        _fit_y(ax, [], [r["images_per_sec"] for r in mine])
        _axes(ax, f"{model} ({mine[0]['image_size']} px crops)", "loader workers",
              "images/sec")
    fig.suptitle("Input pipelines alone: decode, augment, batch (no model)")
    return fig


def _series_label(row: Row) -> str:
    batch = (f"{row['batch_size_per_device']}/dev" if row["scaling"] == "weak"
             else f"{row['global_batch_size']} global")
    data = "" if row["data_label"] == "synthetic" else f" {row['data_label']}"
    return f"{runner_label(row)} {row['precision']} b={batch}{data}"


def _series_labels(row: Row, rows: list[Row]) -> list[str]:
    """The lines a row is a point of. Without multi-node rows: its configuration's line. With
    them: the configuration on one node (its 1-node rows, over devices), and across nodes at
    a fixed number of devices per node (the rows of that per-node count, 1 node included),
    each point at its total device count."""
    label = _series_label(row)
    if not any((r.get("num_nodes") or 1) > 1 for r in rows):
        return [label]
    nodes = row.get("num_nodes") or 1
    per_node = row["num_devices"] // nodes
    spans = any((r.get("num_nodes") or 1) > 1 and r["num_devices"] // r["num_nodes"] == per_node
                and _series_label(r) == label for r in rows)
    labels = [f"{label} 1 node"] if nodes == 1 else []
    return labels + ([f"{label} {per_node}/node x nodes"] if spans else [])


def _subplots(plt: Any, n: int) -> tuple[Any, list[Any]]:
    # the legend sits right of each panel: the width leaves it room
    fig, axes = plt.subplots(1, n, figsize=(8.5 * n, 4.8), squeeze=False)
    return fig, list(axes[0])


def _axes(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        # right of the panel, long labels wrapped, so the legend never narrows the axes much
        ax.legend(handles, [textwrap.fill(t, LEGEND_WIDTH) for t in labels], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)

