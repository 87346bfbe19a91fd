"""Published figures as data: what others measured for our models (reference/published.csv),
each row with its source, drawn beside the sweep's runs and listed in report.html.

Every row names its source (and a url where the source can be found), the system that ran
(framework, strategy), our model name (`model`, a folder of models/) beside the name as
published (`model_as_published`, `model_match`: exact or a variant, `model_note`: how it
differs), the data (synthetic or real; `data_detail` as published), the precision (fp32 unless
the source says AMP / mixed precision: then fp16), the hardware and its GPU, the GPU count,
the batch per GPU and the global batch where the source states or implies them, and the
images/sec. `series` groups a source's rows that share one 1-GPU baseline: a row's scaling
efficiency is its images/sec over (that 1-GPU figure x its GPUs), as the sources compute it
(rossumai's Keras rows: both parameter-server placements against the 1-GPU run).

Issue 27 adds the sharded-training sources (torchtitan's FSDP2 Llama 3.1 8B tables,
llm-foundry's MPT table, DeepSpeed's ZeRO-2 and ZeRO-3 Offload figures) and the columns they
need, after the others (a file without them still loads; their values are then None):
`strategy` (the harness runner and option that does what the source ran, e.g.
torch_fsdp2[reshard_after_forward=true] for FSDP FULL_SHARD, deepspeed[stage=2]), `seq_len`,
`tokens_per_sec`, `tokens_per_sec_per_gpu`, `mfu` and `hfu` (fractions; the sources print
percent), `tflops_per_gpu`, `memory_gib_per_gpu` and `commit` (the source repository's commit
the row was read at). A language-model row's images_per_sec is sequences/sec where the source
states it, else empty; a row whose model is not one of ours has model_match "other" and keeps
the published model's name (llama3_8b, mpt_1b): it is listed, and drawn only beside a sweep of
that name.

Issue 28 adds what a source says of training to accuracy, after those: `epochs` trained,
`epoch_time_s` (seconds per epoch as published), `total_time_s` (the whole training's wall
time: seed 004's 74m10s is 4450) and `final_accuracy` (a fraction; empty where the source
gives no number: seed 004 shows its accuracy only as a plot). Mode converge's seed table
(bench/report/converge.py) puts them beside the measured rows.

The multi-node figures (Goyal et al. 2017, Horovod 2018) have no images/sec per device count;
they are in reference/multi_node.csv, shown here for sweeps that cross nodes.

Stdlib only (csv): the parent's report path needs no pandas; `load_published_frame` is the
notebook's pandas view.
"""

from __future__ import annotations

import csv
import html
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plotting import published_style

REFERENCE = REPO_ROOT / "reference"
PUBLISHED = REFERENCE / "published.csv"
MULTI_NODE = REFERENCE / "multi_node.csv"

FIELDS = ("source", "source_short", "url", "system", "model", "model_as_published",
          "model_match", "model_note", "data", "data_detail", "precision", "hardware", "gpu",
          "gpus", "batch_per_gpu", "global_batch", "images_per_sec", "series", "notes",
          "strategy", "seq_len", "tokens_per_sec", "tokens_per_sec_per_gpu", "mfu", "hfu",
          "tflops_per_gpu", "memory_gib_per_gpu", "commit", "epochs", "epoch_time_s",
          "total_time_s", "final_accuracy")
NUMBERS = ("gpus", "batch_per_gpu", "global_batch", "images_per_sec", "seq_len",
           "tokens_per_sec", "tokens_per_sec_per_gpu", "mfu", "hfu", "tflops_per_gpu",
           "memory_gib_per_gpu", "epochs", "epoch_time_s", "total_time_s", "final_accuracy")
# A published figure more than ROOM x the measured maximum is marked at the axis edge rather
# than drawn at its value (draw_published).
ROOM = 3.0
OFF_AXIS_ENTRIES = 3  # more systems off axis than this share one legend entry


def _number(text: str | None) -> float | int | None:
    if not text:
        return None
    value = float(text)
    return int(value) if value.is_integer() else value


@lru_cache(maxsize=4)
def _load(path: Path) -> tuple[dict[str, Any], ...]:
    with open(path, newline="") as fh:
        rows = [dict(r) for r in csv.DictReader(fh)]
    for r in rows:
        for key in FIELDS:  # a file from before a column was added: the column is empty
            r.setdefault(key, "")
            if r[key] is None:
                r[key] = ""
        for key in NUMBERS:
            r[key] = _number(r[key])
    base = {r["series"]: r["images_per_sec"] for r in rows if r["gpus"] == 1}
    for r in rows:
        one = base.get(r["series"])
        r["scaling_efficiency"] = (r["images_per_sec"] / (one * r["gpus"])
                                   if one and r["images_per_sec"] is not None else None)
    return tuple(rows)


def load_published(path: Path | str = PUBLISHED) -> list[dict[str, Any]]:
    """The rows of reference/published.csv: numbers as numbers (gpus, batch_per_gpu,
    global_batch, images_per_sec, the language-model columns; None where the source gives
    none) plus scaling_efficiency
    against the row's series' 1-GPU figure (None where the series has none)."""
    return [dict(r) for r in _load(Path(path))]


def select(rows: Iterable[dict[str, Any]], models: Iterable[str] | None = None,
           devices: Iterable[int] | None = None, data: Iterable[str] | None = None,
           precision: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The rows of these models, GPU counts, data kinds (synthetic / real) and precisions;
    None keeps every value of that column."""
    keep = {k: set(v) for k, v in (("model", models), ("gpus", devices), ("data", data),
                                   ("precision", precision)) if v is not None}
    return [r for r in rows if all(r[k] in v for k, v in keep.items())]


def label(row: dict[str, Any]) -> str:
    """A row's short label on a chart: its GPU and its source (and real data, if so)."""
    data = ", real data" if row["data"] == "real" else ""
    return f"{row['gpu']}, {row['source_short']}{data}"


def published_value(row: dict[str, Any], value: str) -> float | None:
    """A published row's images_per_sec, scaling_efficiency or speedup (efficiency x GPUs)."""
    if value == "speedup":
        eff = row["scaling_efficiency"]
        return None if eff is None else eff * row["gpus"]
    return row[value]


def _amount(v: float, value: str) -> str:
    """A figure as a chart's text writes it (efficiency already in percent)."""
    if value == "images_per_sec":
        return f"{v:,.0f} img/s"
    return f"{v:.0f}%" if value == "scaling_efficiency" else f"{v:.2f}x"


def draw_published(ax: Any, model: str, measured: list[dict[str, Any]],
                   value: str = "images_per_sec", *, scale: float = 1.0,
                   table: list[dict[str, Any]] | None = None,
                   room: float = ROOM) -> list[dict[str, Any]]:
    """Draw on a device-count chart of `model` the published figures (`table`, default
    reference/published.csv) at the device counts the sweep ran it at (`measured`: the
    summary's ok rows), `value` images_per_sec, speedup or scaling_efficiency (times
    `scale`: 100 for percent). Call it after the measured series, on axes fitted to them.

    A figure up to `room` x the measured maximum (and, on a log axis, down to the minimum over
    `room`) is drawn at its value: a hollow marker on a dotted line through each system's rows
    of a series, one legend entry "published: <GPU, source>" each. One outside is not drawn at
    its value, so a 2017 GPU figure cannot squash CPU runs to the bottom of the axis: a hollow
    triangle on the axis edge at its device count, with the figure in text ("published
    TF docs 2017: 1,450 img/s ↑"), and a legend entry with the figures. Returns the rows
    drawn either way (none: the axes are left as they were)."""
    counts = {r["num_devices"] for r in measured if r["model"] == model}
    table = load_published() if table is None else table
    rows = [r for r in select(table, [model], counts) if published_value(r, value) is not None]
    if not rows:
        return []
    ours = [r[value] * scale for r in measured
            if r["model"] == model and r.get(value) is not None]
    log = ax.get_yscale() == "log"
    high = room * max(ours) if ours else float("inf")
    low = min((v for v in ours if v > 0), default=0.0) / room if log else float("-inf")
    names = list(dict.fromkeys(label(r) for r in rows))
    drawn: set[str] = set()
    on: list[float] = []
    off: dict[str, list[dict[str, Any]]] = {}
    for series, system in dict.fromkeys((r["series"], r["system"]) for r in rows):
        pts = [r for r in rows if r["series"] == series and r["system"] == system]
        pts += [r for r in rows if r["series"] == series and r["gpus"] == 1 and r not in pts]
        pts.sort(key=lambda r: r["gpus"])
        name = label(pts[0])
        style = published_style(names.index(name))
        inside = [r for r in pts if low <= published_value(r, value) * scale <= high]
        off.setdefault(name, [])
        off[name] += [r for r in pts if r not in inside and r not in off[name]]
        if inside:
            ys = [published_value(r, value) * scale for r in inside]
            ax.plot([r["gpus"] for r in inside], ys, alpha=0.9, **style,
                    label=None if name in drawn else f"published: {name}")
            drawn.add(name)
            on += ys
    _mark_off_axis(ax, {n: p for n, p in off.items() if p}, names, value, scale, low)
    bottom, top = ax.get_ylim()
    if on and max(on) > top:
        top = max(on) * 1.08
    if any(p for p in off.values()):
        top *= 1.12  # room for the off-axis text under the top edge
    if on and log and min(on) < bottom:
        bottom = min(on) / 1.08
    ax.set_ylim(bottom, top)
    return rows


def _mark_off_axis(ax: Any, off: dict[str, list[dict[str, Any]]], names: list[str],
                   value: str, scale: float, low: float) -> None:
    """The published figures outside the axis: a legend entry per system with its figures,
    a triangle on the axis edge per device count with the figures in text."""
    if not off:
        return
    from matplotlib.transforms import blended_transform_factory

    edge = blended_transform_factory(ax.transData, ax.transAxes)
    flat = [r for pts in off.values() for r in pts]
    if len(off) > OFF_AXIS_ENTRIES:  # one legend line for them all, not a wall of text
        figures = sorted(published_value(r, value) * scale for r in flat)
        ax.plot([], [], marker="^", color="black", markerfacecolor="none", linestyle="none",
                label=f"published, off axis: {len(off)} systems, {_amount(figures[0], value)} "
                      f"to {_amount(figures[-1], value)} (report.html lists them)")
        off = {}
    for name, pts in off.items():
        figures = sorted((published_value(r, value) * scale, r["gpus"]) for r in pts)
        text = (", ".join(f"{_amount(v, value)} at {g}" for v, g in figures)
                if len(figures) <= 2 else
                f"{_amount(figures[0][0], value)} to {_amount(figures[-1][0], value)}")
        ax.plot([], [], **{**published_style(names.index(name)), "linestyle": "none"},
                label=f"published: {name}: {text}, off axis")
    counts = sorted({r["gpus"] for r in flat})
    for gpus in counts:
        for below in (False, True):
            here = [published_value(r, value) * scale for r in flat if r["gpus"] == gpus
                    and (published_value(r, value) * scale < low) == below]
            if not here:
                continue
            arrow = "↓" if below else "↑"
            one = next(r for r in flat if r["gpus"] == gpus
                       and published_value(r, value) * scale == here[0])
            text = (f"published {one['source_short']}: {_amount(here[0], value)} {arrow}"
                    if len(here) == 1 else
                    f"{len(here)} published: {_amount(min(here), value)} to "
                    f"{_amount(max(here), value)} {arrow}")
            y = 0.025 if below else 0.975  # the triangle just inside the edge
            ax.plot([gpus], [y], transform=edge, marker="v" if below else "^",
                    markersize=8, color="black", markerfacecolor="none", linestyle="none")
            left, right = ax.get_xlim()
            at = (gpus - left) / ((right - left) or 1)
            ha = "left" if at < 0.3 else "right" if at > 0.7 else "center"
            ax.annotate(text, (gpus, y), xycoords=edge, xytext=(
                {"left": -5, "right": 5, "center": 0}[ha], 7 if below else -7),
                textcoords="offset points", ha=ha, va="bottom" if below else "top",
                fontsize=7)


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _table(head: list[str], body: list[list[str]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{th}</tr>{tr}</table>"


def _source(row: dict[str, Any]) -> str:
    text = _e(row["source"])
    return f'<a href="{_e(row["url"])}">{text}</a>' if row.get("url") else text


def published_section(runs: Iterable[dict[str, Any]]) -> str:
    """report.html's "Published figures": for each model of `runs` (the summary rows, the
    pipeline rows and the records alike), a table of its published rows, the device counts
    the sweep ran in bold, or a line saying none is known; the multi-node figures too when a
    run crossed nodes."""
    runs = list(runs)
    models = sorted({r["model"] for r in runs if r.get("model")})
    ran = {(r["model"], r["num_devices"]) for r in runs
           if r.get("model") and r.get("num_devices")}
    parts = ['<h2 id="published">Published figures</h2>',
             "<p>What others published for this sweep's models (reference/published.csv; not "
             "measured here), each row with its source. Compare like with like: GPU, "
             "precision, batch and data differ from row to row and from this sweep. "
             "Efficiency is against the same series' 1-GPU figure of the source. GPU counts "
             "this sweep ran are in bold; the charts draw those rows beside the runs.</p>"]
    if not models:
        parts.append("<p>No runs, so no model to match.</p>")
    table = load_published()
    for model in models:
        rows = select(table, [model])
        parts.append(f"<h3>{_e(model)}</h3>")
        if not rows:
            parts.append(f"<p>No published figure for {_e(model)} in "
                         "reference/published.csv.</p>")
            continue
        llm = any(r["tokens_per_sec_per_gpu"] is not None or r["mfu"] is not None
                  for r in rows)
        body = [[_e(r["system"]), _e(r["hardware"]),
                 (f"<b>{r['gpus']}</b>" if (model, r["gpus"]) in ran else _e(r["gpus"])),
                 _cell(r["batch_per_gpu"], ""), _e(r["precision"]), _e(r["data_detail"]),
                 _e(r["model_as_published"]), _cell(r["images_per_sec"], ","),
                 _cell(r["scaling_efficiency"], ".0%")]
                + ([_e(r["strategy"] or "-"), _cell(r["seq_len"], ""),
                    _cell(r["tokens_per_sec_per_gpu"], ","), _cell(r["mfu"], ".1%")]
                   if llm else [])
                + [_source(r), _e(r["notes"])]
                for r in rows]
        parts.append(_table(["system", "hardware", "GPUs", "batch/GPU", "precision", "data",
                             "model as published", "images/sec", "efficiency"]
                            + (["strategy", "seq len", "tokens/s/GPU", "MFU"] if llm else [])
                            + ["source", "notes"], body))
        notes = dict.fromkeys(f"{r['model_as_published']}: {r['model_note']}" for r in rows)
        parts.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in notes) + "</ul>")
    if any((r.get("num_nodes") or 1) > 1 for r in runs):
        parts.append(_multi_node(models))
    return "".join(parts)


def load_multi_node(path: Path | str = MULTI_NODE) -> list[dict[str, str]]:
    """reference/multi_node.csv's rows as written (strings)."""
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _multi_node(models: list[str]) -> str:
    rows = load_multi_node()
    mine = [r for r in rows if r["model"] in models]
    heading = ("Across nodes (reference/multi_node.csv)" if mine else
               "Across nodes (reference/multi_node.csv; none for this sweep's models, all "
               "shown)")
    body = [[_e(r["model"]), _e(r["hardware"]), _e(r["interconnect"]),
             _e(f"{r['nodes']} x {r['gpus_per_node']}"), _e(r["batch_per_gpu"]),
             _e(f"{float(r['scaling_efficiency']):.0%} vs {r['efficiency_baseline_gpus']}"
                f" GPU{'' if r['efficiency_baseline_gpus'] == '1' else 's'}"
                if r["scaling_efficiency"] else "-"),
             f'<a href="{_e(r["url"])}">{_e(r["source"])}</a>'] for r in mine or rows]
    return (f"<h3>{_e(heading)}</h3>"
            + _table(["model", "hardware", "interconnect", "nodes x GPUs", "batch/GPU",
                      "efficiency", "source"], body))


def load_published_frame(models: Iterable[str] | None = None,
                         devices: Iterable[int] | None = None,
                         data: Iterable[str] | None = None) -> Any:
    """The published rows (with scaling_efficiency) as a pandas DataFrame, for notebooks."""
    import pandas as pd

    rows = select(load_published(), models, devices, data)
    return pd.DataFrame(rows, columns=[*FIELDS, "scaling_efficiency"])


def strategy_rows(model: str | None = None) -> list[dict[str, Any]]:
    """The published rows that name a harness strategy (issue 27's sharded-training sources),
    of `model` if given: what the report's strategy table lists beside the measured ones."""
    return [r for r in load_published() if r["strategy"]
            and (model is None or r["model"] == model)]
