"""Mode converge's figures from its records (runners/converge.py writes them): one row per
configuration and device count (time per epoch, total time, time to target with its interval
over repeats, final accuracy, speed-up), and the decomposition `explain` gives of time to
target: epochs x time per epoch + evaluation, and against 1 device, the speed-up per epoch
times the change in epochs. bench/report/converge.py renders them.

Stdlib only."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from bench.analysis.converge_score import (
    MEDIAN,
    MORE_EPOCHS,
    SEEDS_REPEAT,
    energy_to_target,
    epochs_needed,
    more_epochs_test,
    run_seed,
    score,
)
from bench.records.grouping import runner_label


def converge_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("mode") == "converge"]


def _epoch_time(rec: Mapping[str, Any]) -> float | None:
    """Seconds per training epoch, the median over the epochs after the first (which holds
    compilation) or the first alone; training only, as the seed's 'each epoch took ~63 s'."""
    curve = rec.get("curve") or []
    times = [p.get("train_s") for p in (curve[1:] or curve) if isinstance(p, Mapping)]
    times = [t for t in times if isinstance(t, (int, float))]
    return statistics.median(times) if times else None


def _median(values: list[Any]) -> float | None:
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(nums) if nums else None


def interval(values: list[Any]) -> tuple[float, float, str] | None:
    """(low, high, kind) of repeats' values by the summary's rule
    (bench.analysis.stats.median_interval: with 2 the range, called so; from 3 on the
    bootstrap CI of the median); None for fewer than 2."""
    from bench.analysis.stats import median_interval

    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    low, high, kind = median_interval(nums)
    return None if low is None or high is None else (low, high, kind)


def converge_rows(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration and device count: the seed-form table. Time per epoch,
    total time (to the target, else of all epochs), final and best accuracy, epochs, time to
    target scored over repeats (bench/analysis/converge_score.py: MLPerf's mean of N-2 from 5
    runs, else the median with its interval), energy to target, seeds, speed-up of the time
    to target over the same configuration's 1-device row and the test of its epochs."""
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for rec in converge_records(records):
        key = (runner_label(rec), rec.get("model"), rec.get("precision"),
               rec.get("batch_size_per_device"), rec.get("num_nodes") or 1,
               rec.get("num_devices"))
        groups.setdefault(key, []).append(rec)
    rows = [_row(key, recs) for key, recs in groups.items()]
    _against_one_device(rows)
    rows.sort(key=lambda r: (str(r["model"]), str(r["runner"]), r["num_nodes"],
                             r["num_devices"] or 0))
    return rows


def _row(key: tuple[Any, ...], recs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A configuration's row from its records (repeats in run order)."""
    runner, model, precision, batch, nodes, devices = key
    recs = sorted(recs, key=lambda r: r.get("repeat") or 0)
    ok = [r for r in recs if r.get("status") == "ok"]
    judged = ok or [r for r in recs if r.get("curve")]
    times = [r.get("time_to_target_s") if isinstance(r.get("time_to_target_s"), (int, float))
             else None for r in ok]
    reached = [t for t in times if t is not None]
    headline = score(times)
    energy, energy_why = energy_to_target(ok, headline)
    recipe = (recs[0].get("result") or {}).get("converge") or recs[0].get("converge") or {}
    seeds = [run_seed(r) for r in recs]
    if isinstance(seeds[0], int):  # the config's seed: the first run's less its repeat
        recipe = {**recipe, "seed": (seeds[0] - (recs[0].get("repeat") or 0)) % 2**32}
    return {
        "runner": runner, "model": model, "precision": precision,
        "batch_size_per_device": batch, "num_nodes": nodes, "num_devices": devices,
        "global_batch_size": recs[0].get("global_batch_size"),
        "virtual_devices": recs[0].get("virtual_devices"),
        "runs": len(recs), "runs_ok": len(ok), "runs_reached": len(reached),
        "status": "ok" if ok else ",".join(sorted({str(r.get("status")) for r in recs})),
        "reason": None if ok else next((r.get("reason") for r in recs if r.get("reason")),
                                       None),
        "epoch_time_s": _median([_epoch_time(r) for r in judged]),
        "epochs": _median([r.get("epochs_run") for r in judged]),
        "total_time_s": _median([r.get("time_to_target_s") or r.get("converge_time_s")
                                 for r in judged]),
        "time_to_target_s": headline.value,
        "time_to_target_score": headline.words(),
        "time_to_target_interval": interval(reached) if headline.kind == MEDIAN else None,
        "time_to_target_runs": times,
        "energy_to_target_j": energy, "energy_to_target": energy_why,
        "epochs_to_target": _median([r.get("epochs_to_target") for r in ok]),
        "epochs_needed": (epochs_needed(ok, recipe["max_epochs"])
                          if recipe.get("target_accuracy") is not None else None),
        "seeds": seeds,
        "final_accuracy": _median([r.get("final_accuracy") for r in judged]),
        "best_accuracy": _median([r.get("best_accuracy") for r in judged]),
        "images_per_sec": _median([r.get("images_per_sec") for r in judged]),
        "target_reason": next((r.get("target_reason") for r in judged
                               if r.get("target_reason")), None),
        "recipe": recipe or None,
        "flags": [SEEDS_REPEAT] if len(set(map(str, seeds))) < len(seeds) else [],
    }


def _against_one_device(rows: list[dict[str, Any]]) -> None:
    """Each row against the same configuration's 1-device row: the speed-up of its time to
    target (of its total where no target is set; none where either missed the target), and,
    for more than 1 device, the one-sided test of its epochs to target (flag MORE_EPOCHS)."""
    base = {(r["runner"], r["model"], r["precision"], r["batch_size_per_device"]): r
            for r in rows if r["num_devices"] == 1 and r["num_nodes"] == 1}
    for row in rows:
        one = base.get((row["runner"], row["model"], row["precision"],
                        row["batch_size_per_device"]))
        has_target = (row["recipe"] or {}).get("target_accuracy") is not None
        mine, theirs = (("time_to_target_s", "time_to_target_s") if has_target
                        else ("total_time_s", "total_time_s"))
        row["speedup"] = (one[theirs] / row[mine] if one and one[theirs] and row[mine]
                          else None)
        row["epochs_test"] = None
        if one is not None and one is not row and row["epochs_needed"] \
                and one["epochs_needed"]:
            row["epochs_test"] = more_epochs_test(row["epochs_needed"], one["epochs_needed"])
            if row["epochs_test"]["more"]:
                row["flags"].append(MORE_EPOCHS)


def clock(seconds: float | None) -> str:
    """74m10s, as seed 004 writes it (minutes however many); 12.3s under a minute; - for none."""
    if not isinstance(seconds, (int, float)):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


def _devices_words(row: Mapping[str, Any]) -> str:
    n, nodes = row.get("num_devices"), row.get("num_nodes") or 1
    kind = "virtual CPU" if row.get("virtual_devices") else "GPU"
    return f"{nodes}x{n // nodes} {kind}" if nodes > 1 else f"{n} {kind}"


def explain_lines(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """For each converge row, where its time to target went: the epochs times the training
    time per epoch (the first apart: it holds compilation), plus the evaluations; and against
    the same configuration on 1 device, the speed-up per epoch and the change in epochs the
    larger global batch needed, whose ratio is the speed-up to target."""
    recs = [r for r in converge_records(records) if r.get("status") == "ok" and r.get("curve")]
    rows = converge_rows(recs)
    by_key = {(r["runner"], r["model"], r["precision"], r["batch_size_per_device"],
               r["num_nodes"], r["num_devices"]): r for r in rows}
    lines = []
    for row in rows:
        label = (f"{row['runner']} {row['model']} {row['precision']} "
                 f"b={row['batch_size_per_device']}/dev, {_devices_words(row)}")
        mine = [r for r in recs if runner_label(r) == row["runner"]
                and r.get("model") == row["model"] and r.get("num_devices") == row["num_devices"]
                and r.get("batch_size_per_device") == row["batch_size_per_device"]
                and r.get("precision") == row["precision"]]
        rec = mine[0]
        curve = rec["curve"]
        first = curve[0].get("train_s") or 0.0
        later = [p.get("train_s") or 0.0 for p in curve[1:]]
        evals = sum(p.get("eval_s") or 0.0 for p in curve)
        total = rec.get("time_to_target_s") or rec.get("converge_time_s")
        target = (row["recipe"] or {}).get("target_accuracy")
        epochs = f"{len(curve)} epoch{'s' if len(curve) != 1 else ''}"
        what = (f"to {target:.0%} in {epochs}" if rec.get("time_to_target_s")
                else f"{epochs}, target not reached" if target is not None
                else f"{epochs} (no target)")
        epoch = statistics.median(later) if later else first
        then = f", then {clock(epoch)} each" if later else ""
        parts = [f"{what}, {clock(total)} = training {clock(first + sum(later))} (first epoch "
                 f"{clock(first)}{then}) + evaluation {clock(evals)}"]
        one = by_key.get((row["runner"], row["model"], row["precision"],
                          row["batch_size_per_device"], 1, 1))
        if row["num_devices"] > 1 and one and one["epoch_time_s"] and row["epoch_time_s"] \
                and one["epochs"] and row["epochs"] and one["total_time_s"] \
                and row["total_time_s"]:
            per_epoch = one["epoch_time_s"] / row["epoch_time_s"]
            epochs = row["epochs"] / one["epochs"]
            words = (f"vs 1 device: {per_epoch:.2f}x as fast per epoch, {epochs:.2f}x the "
                     f"epochs (global batch {row['global_batch_size']} vs "
                     f"{one['global_batch_size']}; lr_scaling "
                     f"{(row['recipe'] or {}).get('lr_scaling')})")
            if row["speedup"] is not None:
                goal = "to the target" if target is not None else "over the epochs"
                words += (f": {row['speedup']:.2f}x as fast {goal} overall (first epochs "
                          "and evaluations included)")
            else:
                words += ": no time to accuracy to compare (the target was not reached)"
            parts.append(words)
        lines.append(f"{label}: " + "; ".join(parts))
    return lines


def time_to_target_words(records: list[Mapping[str, Any]]) -> str | None:
    """One side of a comparison in words: its time to target scored as the table scores it
    (MLPerf's mean of N-2 from 5 runs, else the median with its interval, named), how many
    runs reached it, the median final accuracy; None for records that are not mode converge."""
    recs = converge_records(records)
    if not recs:
        return None
    ok = [r for r in recs if r.get("status") == "ok"]
    times = [r.get("time_to_target_s") if isinstance(r.get("time_to_target_s"), (int, float))
             else None for r in ok]
    reached = [t for t in times if t is not None]
    headline = score(times)
    spread = interval(reached) if headline.kind == MEDIAN else None
    final = _median([r.get("final_accuracy") for r in ok])
    if headline.value is None:
        head = "target not reached" + (f" ({headline.why})" if reached else "")
    elif headline.kind == MEDIAN:  # as before MLPerf's rule: the median, its interval
        head = f"to target {clock(headline.value)}" + (
            f" ({spread[2]} {clock(spread[0])}-{clock(spread[1])})" if spread else "")
    else:
        head = f"to target {clock(headline.value)} ({headline.words()})"
    return (f"{head}, {len(reached)}/{len(recs)} runs reached it"
            + (f", final accuracy {final:.1%}" if final is not None else ""))
