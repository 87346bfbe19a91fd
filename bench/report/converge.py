"""Mode converge in the report: the recipe in words, the seed-form table (time per epoch,
total time, final accuracy, speed-up, with published rows beside) and the chart of held-out
accuracy against wall time per device count (runners/converge.py writes the records).

Imports pandas-free code only (matplotlib for the chart, in the report's process)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.analysis.converge import clock, converge_records
from bench.analysis.converge_score import MORE_EPOCHS, SEEDS_REPEAT, epochs_test_words
from bench.plotting import save_figure, series_style, virtual_note
from bench.records.grouping import runner_label
from bench.records.store import atomic_file

CSV_NAME = "converge.csv"
CHART_NAME = "converge_accuracy_vs_time.png"


def recipe_line(recipe: Mapping[str, Any]) -> str:
    """The recipe in one line, as the dry run, the table and the chart's title show it."""
    target = recipe.get("target_accuracy")
    epochs = f"{recipe['max_epochs']} epoch{'s' if recipe['max_epochs'] != 1 else ''}"
    stop = (f"target {target:.0%} held-out accuracy or {epochs}" if target is not None
            else f"{epochs} (no target)")
    scaling = recipe["lr_scaling"]
    lr = (f"base_lr {recipe['base_lr']:g} for batch {recipe['reference_batch']}"
          + (f" scaled {scaling}" if scaling != "none" else " (not scaled)"))
    schedule = recipe["schedule"] + (f" (power {recipe['poly_power']:g})"
                                     if recipe["schedule"] == "poly" else "")
    if recipe["schedule"] == "step":
        schedule += f" (x{recipe['step_gamma']:g} every {recipe['step_epochs']} epochs)"
    warm = (f", warm-up {recipe['warmup_epochs']:g} epochs" if recipe["warmup_epochs"] else "")
    decay = (f", weight decay {recipe['weight_decay']:g}" if recipe["weight_decay"] else "")
    return (f"{stop}; {recipe['optimizer']} momentum {recipe['momentum']:g}{decay}, {lr}"
            f"{warm}, schedule {schedule}; last batch {recipe['last_batch']}; augmentation "
            f"{recipe['augmentation']}; seed {recipe['seed']} + the repeat's number")


def _devices(row: Mapping[str, Any]) -> str:
    kind = "vcpu" if row.get("virtual_devices") else "gpu"
    n = row.get("num_devices")
    nodes = row.get("num_nodes") or 1
    return f"{nodes}x{n // nodes} {kind}" if nodes > 1 else f"{n} {kind}"


def published_rows(models: Iterable[str]) -> list[dict[str, Any]]:
    """reference/published.csv's rows that give training times (seed 004's), for the models
    of the table."""
    from bench.analysis.published import load_published

    wanted = set(models)
    return [r for r in load_published() if r.get("model") in wanted
            and r.get("total_time_s") is not None]


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The seed-form table as text (the terminal and `report`), the lines under it: the
    recipe, how time to target is scored, targets not reached, epochs against 1 device,
    seeds, energy."""
    if not rows:
        return []
    head = ("runner", "model", "devices", "batch", "s/epoch", "epochs", "total", "to target",
            "energy", "final acc", "speedup", "status", "flags")
    body = [_table_row(r) for r in rows]
    for p in published_rows({r["model"] for r in rows}):
        body.append((f"published: {p['source_short']}", str(p["model"]),
                     f"{p['gpus']} {p.get('gpu') or 'gpu'}", f"{p.get('batch_per_gpu')}/dev",
                     _num(p.get("epoch_time_s"), ".0f"), _num(p.get("epochs"), ".0f"),
                     clock(p.get("total_time_s")), "-", "-",
                     _num(p.get("final_accuracy"), ".1%"), "-", "published", ""))
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head))]
    lines = ["time to accuracy (mode converge; total: to the target, else all epochs, "
             "evaluations included):",
             "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)).rstrip()
              for x in body]
    recipes = {recipe_line(r["recipe"]) for r in rows if r.get("recipe")}
    lines += [f"recipe: {line}" for line in sorted(recipes)]
    lines.append(SCORE_RULE)
    reasons = sorted({f"{r['runner']} {_devices(r)}: {r['target_reason']}" for r in rows
                      if r["target_reason"] and not r["time_to_target_s"]
                      and (r.get("recipe") or {}).get("target_accuracy") is not None})
    lines += [f"not reached: {line}" for line in reasons]
    return lines + _under_table(rows)


SCORE_RULE = ("to target: from 5 runs the MLPerf mean of N-2 (fastest and slowest dropped; "
              "one run short of the target counts as the slowest, two or more leave no "
              "score), fewer runs the median with its interval (docs/CONVERGENCE.md)")


def _table_row(r: Mapping[str, Any]) -> tuple[str, ...]:
    interval = r["time_to_target_interval"]
    to_target = clock(r["time_to_target_s"])
    if interval:
        to_target += f" ({interval[2]} {clock(interval[0])}-{clock(interval[1])})"
    elif r["time_to_target_s"] is not None and r["time_to_target_score"].startswith("MLPerf"):
        to_target += f" ({r['time_to_target_score'].split(',')[0]})"
    return (r["runner"], str(r["model"]), _devices(r), f"{r['batch_size_per_device']}/dev",
            _num(r["epoch_time_s"], ".1f"), _num(r["epochs"], ".0f"),
            clock(r["total_time_s"]), to_target, _num(r["energy_to_target_j"], ".0f", " J"),
            _num(r["final_accuracy"], ".1%"), _num(r["speedup"], ".2f", "x"),
            r["status"] + (f" ({r['reason']})" if r["reason"] else ""), ",".join(r["flags"]))


def _under_table(rows: list[dict[str, Any]]) -> list[str]:
    """Each N-device row's epochs to target against 1 device's (the test, its verdict),
    the seeds of every row's runs, and energy to target where it was not measured."""
    lines = [f"epochs to target, {r['runner']} {_devices(r)}: "
             f"{epochs_test_words(r['epochs_test'])}" for r in rows if r.get("epochs_test")]
    if any(r.get("epochs_test") for r in rows):
        max_epochs = {(r.get("recipe") or {}).get("max_epochs") for r in rows} - {None}
        lines.append("  (a run short of the target counts as max_epochs + 1 = "
                     f"{', '.join(str(m + 1) for m in sorted(max_epochs))} epochs; flag "
                     f"{MORE_EPOCHS}: significantly more epochs than on 1 device)")
    seeds = {",".join(map(str, r["seeds"])) for r in rows}
    if len(seeds) == 1:
        lines.append(f"seeds of the runs (each record's result.converge.seed): {seeds.pop()}"
                     " in every configuration")
    else:
        lines += [f"seeds, {r['runner']} {_devices(r)}: {','.join(map(str, r['seeds']))}"
                  for r in rows]
    shared = [f"{r['runner']} {_devices(r)}" for r in rows if SEEDS_REPEAT in r["flags"]]
    if shared:
        lines.append(f"{SEEDS_REPEAT}: runs of one configuration share a seed, so its repeats "
                     f"are not independent: {', '.join(shared)}")
    missing = sorted({r["energy_to_target"] for r in rows if r["energy_to_target_j"] is None
                      and r["energy_to_target"].startswith("not measured")})
    lines += [f"energy to target: {why}" for why in missing]
    return lines


def _num(value: Any, spec: str, suffix: str = "") -> str:
    return f"{value:{spec}}{suffix}" if isinstance(value, (int, float)) else "-"


def _cell(value: Any) -> Any:
    """A list as its items joined by ';' (seeds, runs' times), else the value."""
    return ";".join("" if v is None else str(v) for v in value) if isinstance(value, list) \
        else value


def write_csv(out: Path, rows: list[dict[str, Any]]) -> Path | None:
    """converge.csv: the table's rows (the recipe as its line)."""
    import csv

    if not rows:
        return None
    path = out / CSV_NAME
    fields = [k for k in rows[0] if k not in ("recipe", "time_to_target_interval",
                                              "epochs_test")]
    fields += ["time_to_target_low_s", "time_to_target_high_s", "time_to_target_interval",
               "more_epochs_p", "recipe"]
    with atomic_file(path, newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        for r in rows:
            interval = r["time_to_target_interval"] or (None, None, None)
            writer.writerow({**{k: _cell(r[k]) for k in fields if k in r},
                             "more_epochs_p": (r["epochs_test"] or {}).get("p"),
                             "time_to_target_low_s": interval[0],
                             "time_to_target_high_s": interval[1],
                             "time_to_target_interval": interval[2],
                             "recipe": recipe_line(r["recipe"]) if r.get("recipe") else None})
    return path


def draw_chart(records: list[Mapping[str, Any]], charts: Path) -> Path | None:
    """Held-out accuracy against wall time, one panel per device count, one line per run
    (colour, marker and line style: runner; repeats share their runner's label), the target
    dashed; the y axis from just under the lowest accuracy to 1; the published totals of the
    same model written under the panels."""
    recs = [r for r in converge_records(records) if r.get("curve")]
    if not recs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted({(r.get("num_nodes") or 1, r.get("num_devices") or 0) for r in recs})
    runners = sorted({runner_label(r) for r in recs})
    fig, axes = plt.subplots(1, len(counts), figsize=(4.2 * len(counts) + 2.6, 4.6),
                             sharey=True, squeeze=False)
    lowest = min(p["accuracy"] for r in recs for p in r["curve"])
    bottom = max(0.0, min(0.9, lowest) - 0.05)
    for ax, (nodes, n) in zip(axes[0], counts, strict=True):
        mine = [r for r in recs if (r.get("num_nodes") or 1, r.get("num_devices") or 0)
                == (nodes, n)]
        labelled: set[str] = set()
        for rec in sorted(mine, key=lambda r: (runner_label(r), r.get("repeat") or 0)):
            name = runner_label(rec)
            i = runners.index(name)
            # marker and line style per runner as well as colour: greyscale reads
            ax.plot([p["wall_s"] for p in rec["curve"]], [p["accuracy"] for p in rec["curve"]],
                    **{**series_style(i), "markersize": 4, "linewidth": 1.2},
                    label=None if name in labelled else name)
            labelled.add(name)
        targets = {(r.get("converge") or {}).get("target_accuracy") for r in mine}
        for target in sorted(t for t in targets if isinstance(t, (int, float))):
            ax.axhline(target, color="grey", linestyle="--", linewidth=1)
        virtual = any(r.get("virtual_devices") for r in mine)
        kind = "virtual CPU device" if virtual else "GPU"
        where = f"{nodes} nodes x {n // nodes}" if nodes > 1 else f"{n}"
        ax.set_title(f"{where} {kind}{'s' if n > 1 else ''}", fontsize=10)
        ax.set_xlabel("wall time since the first step (s)")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom, 1.0)
    axes[0][0].set_ylabel("held-out top-1 accuracy (dashed: target)")
    handles, labels = {}, {}
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
            labels[lab] = lab
    fig.legend([handles[k] for k in sorted(handles)], sorted(labels), loc="center right",
               fontsize=8, frameon=False)
    models = ", ".join(sorted({str(r.get("model")) for r in recs}))
    published = [f"published {p['source_short']}: {p['gpus']} GPU {clock(p['total_time_s'])}"
                 for p in published_rows({r.get("model") for r in recs})]
    fig.suptitle(f"Time to accuracy: {models}, evaluations included{virtual_note(recs)}"
                 + ("\n" + "; ".join(published) if published else ""), fontsize=11)
    charts.mkdir(parents=True, exist_ok=True)
    path = charts / CHART_NAME
    fig.tight_layout(rect=(0, 0, 0.80 if len(counts) > 1 else 0.72, 1))
    save_figure(fig, path, 110)
    plt.close(fig)
    return path


def html_section(rows: list[dict[str, Any]], chart: Path | None) -> str:
    """report.html's time-to-accuracy section: the chart, the table, the recipe."""
    if not rows:
        return ""
    lines = table_lines(rows)
    parts = ["<h2>Time to accuracy</h2>",
             "<p>Mode converge: each run trains on the training split and evaluates on the "
             "held-out split after every epoch; total is the wall time to the target (else of "
             "all epochs), evaluations included; s/epoch is training alone "
             "(docs/CONVERGENCE.md).</p>"]
    if chart is not None:
        parts.append(f'<img src="charts/{html.escape(chart.name)}" alt="accuracy vs time">')
    parts.append("<pre>" + html.escape("\n".join(lines)) + "</pre>")
    return "\n".join(parts)
