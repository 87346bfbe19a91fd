"""Capacity mode: per strategy, the largest batch per device (scale batch) or the deepest GPT
(scale depth) that fits, found by probes.

A search (one per runner x model x precision x devices, and for scale depth x batch) probes a
value by running it: an ordinary benchmark run in its own process (bench.run.sweep.run_one, its
record kept in <results>/probes/runs/), at that batch per device or with that many layers
(bench.plan.runs.capacity_probe). `search` doubles from capacity.start until a probe does not
fit or capacity.max is reached, then bisects between the largest fit and the first misfit until
they are capacity.resolution apart; it assumes, as every such search does, that memory grows
with the value (a fit below a misfit).

A probe fits (`judge`) when its run is ok and, where a budget is declared (device_memory; on
cpu required), every device's peak (the record's device_peak_bytes: the allocator's peak on a
GPU, the process's peak resident memory above its baseline on CPU, runners/memory.py) is
within it. It does not fit when the run ran out of memory (status oom: the framework's error,
a CUDA OOM, the kernel's OOM killer: data, not an error) or its peak is over the budget (status
oom, oom_by budget, with the bytes). Any other outcome (failed, invalid, unavailable, timeout)
says nothing about memory: the search stops there, and its record carries that status.

One record per search, <results>/capacity/<search id>.json (`CAPACITY_DIR`): the largest fit
and the first misfit, every probe (value, status, why, peak per device, its run's record), the
budget and where the limit comes from; bench/report/capacity.py tabulates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.plan.runs import RunSpec, capacity_probe, search_id
from bench.records.store import RETRYABLE, SCHEMA_VERSION, read_json, write_json_atomic
from bench.run.launch import now_iso, record_without_run

CAPACITY_DIR, PROBES_DIR = "capacity", "probes"
# how a search ended: the largest fit and first misfit within the resolution; every value up
# to max fit; not even the first value fits; a probe said nothing about memory
ENDS = ("bracketed", "max_reached", "none_fits", "stopped")


@dataclass
class Search:
    """What a search found: the largest value that fit, the first that did not (None where
    there is none), how it ended (ENDS) and every probe, in the order run."""

    largest_fit: int | None = None
    first_misfit: int | None = None
    end: str = "stopped"
    probes: list[dict[str, Any]] = field(default_factory=list)


def search(probe: Callable[[int], dict[str, Any]], start: int, maximum: int,
           resolution: int = 1) -> Search:
    """Doubling from start (capped at maximum) until a probe does not fit (halving below start
    down to 1 when start itself does not), then bisection between the largest fit and the
    first misfit until they are at most `resolution` apart.
    `probe(value)` returns a dict whose "fits" is True, False, or None (the outcome says
    nothing about memory: the search stops)."""
    if not 1 <= start <= maximum or resolution < 1:
        raise ValueError(f"start {start}, max {maximum}, resolution {resolution}: need "
                         "1 <= start <= max and resolution >= 1")
    found = Search()

    def run(value: int) -> bool | None:
        outcome = {"value": value, **probe(value)}
        found.probes.append(outcome)
        return outcome["fits"]

    value = start
    while True:
        fits = run(value)
        if fits is None:
            return found
        if not fits:
            found.first_misfit = value
            break
        found.largest_fit = value
        if value >= maximum:
            found.end = "max_reached"
            return found
        value = min(2 * value, maximum)
    value = found.first_misfit // 2
    while found.largest_fit is None and value >= 1:  # below start: halving down to 1
        fits = run(value)
        if fits is None:
            return found
        if fits:
            found.largest_fit = value
        else:
            found.first_misfit, value = value, value // 2
    if found.largest_fit is None:
        found.end = "none_fits"
        return found
    while found.first_misfit - found.largest_fit > resolution:
        mid = (found.largest_fit + found.first_misfit) // 2
        fits = run(mid)
        if fits is None:
            return found
        if fits:
            found.largest_fit = mid
        else:
            found.first_misfit = mid
    found.end = "bracketed"
    return found


def device_peaks(rec: dict[str, Any]) -> dict[str, int] | None:
    """The record's peak per device as capacity mode checks it (device_peak_bytes), None where
    the run measured none."""
    peaks = rec.get("device_peak_bytes")
    if not isinstance(peaks, dict) or not peaks:
        return None
    good = {k: v for k, v in peaks.items() if isinstance(v, int) and not isinstance(v, bool)}
    return good if len(good) == len(peaks) else None


def judge(rec: dict[str, Any], budget: int | None) -> dict[str, Any]:
    """A probe's verdict from its run's record: fits (True, False, None: says nothing about
    memory), status (ok, oom, or the run's), oom_by (device: the framework or the kernel ran
    out; budget: the peak is over device_memory), reason, and the peaks."""
    peaks = device_peaks(rec)
    out: dict[str, Any] = {
        "run_id": rec.get("run_id"), "run_status": rec.get("status"), "status": rec.get("status"),
        "fits": None, "oom_by": None, "reason": rec.get("reason"),
        "peak_bytes_per_device": peaks, "peak_bytes": max(peaks.values()) if peaks else None,
        "state_bytes_per_device": rec.get("state_bytes_per_device"),
        "model_state": rec.get("model_state"),
        "params": (rec.get("result") or {}).get("params"),
        "images_per_sec": rec.get("images_per_sec"), "wall_time_s": rec.get("wall_time_s"),
    }
    status = rec.get("status")
    if status == "oom":
        out.update(fits=False, oom_by="device")
    elif status == "ok" and budget is None:
        out["fits"] = True
    elif status == "ok" and peaks is None:
        out.update(status="invalid", reason="the run measured no device peak "
                   "(device_peak_bytes) to check against device_memory")
    elif status == "ok":
        device, worst = max(peaks.items(), key=lambda kv: kv[1])
        if worst > budget:
            out.update(fits=False, status="oom", oom_by="budget", reason=(
                f"peak {worst:,} bytes on {device} > device_memory {budget:,} bytes"))
        else:
            out["fits"] = True
    return out


def limit_text(device: str, budget: int | None) -> str:
    """Where a search's limit comes from, in words."""
    if budget is None:
        return ("the device's memory: a probe fits unless the framework runs out of memory "
                "(status oom)")
    where = ("each GPU's allocator peak" if device == "gpu" else "each virtual CPU device's "
             "peak: the process's peak resident memory over the timed window less its "
             "resident memory before the model was built, a process's N devices each 1/N")
    also = " (and the device's own memory: an out-of-memory error)" if device == "gpu" else ""
    return f"device_memory {budget:,} bytes per device against {where}{also}"


def _value(spec: RunSpec, scale: str) -> int:
    return spec.model_layers if scale == "depth" else spec.batch_size_per_device


def run_search(first: RunSpec, cfg: Any, out: Path,
               launch: Callable[[RunSpec, Path], dict[str, Any]],
               blocked: tuple[str, str] | None = None, reuse: bool = False
               ) -> dict[str, Any]:
    """One search from its first probe: each probe launched by `launch(spec, probes folder)`
    (bench.run.sweep's run_one, or a record without a run where precheck blocked the first:
    `blocked`), or, with `reuse` (--resume), its record from an earlier sweep where that one
    ran ok or out of memory (any other outcome runs again); the capacity record written to
    out/capacity/<search id>.json and returned."""
    scale, bounds, budget = cfg.scale, cfg.capacity, cfg.device_memory
    probes_dir = out / PROBES_DIR
    started = now_iso()

    def probe(value: int) -> dict[str, Any]:
        spec = capacity_probe(first, scale, value)
        earlier = probes_dir / "runs" / f"{spec.run_id}.json"
        rec = None
        if reuse and earlier.is_file():
            rec = read_json(earlier)[0]  # bounded; a damaged probe record runs again
            if not isinstance(rec, dict) or rec.get("status") not in ("ok", "oom"):
                rec = None  # a probe that said nothing about memory runs again
        if rec is None:
            rec = (record_without_run(spec, probes_dir, {}, *blocked) if blocked
                   else launch(spec, probes_dir))
        return {**judge(rec, budget), "record": f"{PROBES_DIR}/runs/{spec.run_id}.json"}

    found = search(probe, _value(first, scale), bounds["max"], bounds["resolution"])
    last = found.probes[-1]
    at_fit = next((p for p in found.probes if p["value"] == found.largest_fit), None)
    stopped = found.end == "stopped"
    sid = search_id(first, scale)
    rec = {
        "schema_version": SCHEMA_VERSION, "mode": "capacity", "search_id": sid,
        "sweep_id": first.sweep_id, "runner": first.runner, "family": first.family,
        "model": first.model, "num_devices": first.num_devices, "num_nodes": first.num_nodes,
        "device": first.device, "virtual_devices": first.virtual_devices,
        "precision": first.precision, "options": first.options, "variant": first.variant,
        "scale": scale,
        "batch_size_per_device": (first.batch_size_per_device if scale == "depth"
                                  else found.largest_fit),
        "model_layers": found.largest_fit if scale == "depth" else None,
        "start": _value(first, scale), "max": bounds["max"],
        "resolution": bounds["resolution"], "device_memory": budget,
        "limit": limit_text(first.device, budget),
        "status": last["status"] if stopped else "ok",
        "reason": (f"probe at {last['value']}: {last['run_status']}: {last['reason']}" if stopped
                   else None),
        "end": found.end, "largest_fit": found.largest_fit,
        "first_misfit": found.first_misfit,
        "peak_at_largest": at_fit["peak_bytes_per_device"] if at_fit else None,
        "peak_bytes_at_largest": at_fit["peak_bytes"] if at_fit else None,
        "state_bytes_per_device": at_fit["state_bytes_per_device"] if at_fit else None,
        "model_state": at_fit["model_state"] if at_fit else None,
        "params_at_largest": at_fit["params"] if at_fit else None,
        "probes": found.probes, "started_at": started, "finished_at": now_iso(),
    }
    if found.end == "none_fits":
        rec["reason"] = smallest_words(rec)
    write_json_atomic(capacity_path(out, sid), rec)
    return rec


def capacity_path(out: Path, sid: str) -> Path:
    return Path(out) / CAPACITY_DIR / f"{sid}.json"


def load_capacity(out: Path) -> list[dict[str, Any]]:
    """Every readable capacity record of a results folder, by search id."""
    records = []
    for path in sorted((Path(out) / CAPACITY_DIR).glob("*.json")):
        rec = read_json(path)[0]  # bounded (store.read_json); a damaged one is left out
        if isinstance(rec, dict) and rec.get("mode") == "capacity":
            records.append(rec)
    return records


def searches_done(out: Path, scale: str, firsts: list[RunSpec], retry_failed: bool = False
                  ) -> set[str]:
    """The first probes' run ids of the searches --resume skips: those with a capacity record
    (but a search that stopped on a retryable status, with --retry-failed)."""
    done = set()
    for first in firsts:
        rec = read_json(capacity_path(out, search_id(first, scale)))[0]
        if not isinstance(rec, dict):  # none, or damaged: the search runs again
            continue
        if not (retry_failed and rec.get("status") in RETRYABLE):
            done.add(first.run_id)
    return done


def outcome_text(rec: dict[str, Any]) -> str:
    """A search's end in one phrase."""
    what = "layers" if rec["scale"] == "depth" else "batch per device"
    peak = rec.get("peak_bytes_at_largest")
    at = f" (peak {peak / 2**20:.1f} MiB per device)" if peak is not None else ""
    n = len(rec["probes"])
    if rec["end"] == "bracketed":
        return (f"largest {what} {rec['largest_fit']}{at}, first misfit {rec['first_misfit']}"
                f" ({n} probes)")
    if rec["end"] == "max_reached":
        return f"every {what} up to max {rec['largest_fit']} fits{at} ({n} probes)"
    if rec["end"] == "none_fits":
        return f"does not fit: {smallest_words(rec)} ({n} probes)"
    return f"{rec['status']}: {rec['reason']}"


def smallest_words(rec: dict[str, Any]) -> str:
    """Why nothing fits: the smallest probe, its peak against the budget, or its error."""
    what = "layers" if rec["scale"] == "depth" else "batch per device"
    smallest = min(rec["probes"], key=lambda p: p["value"])
    peak, budget = smallest.get("peak_bytes"), rec.get("device_memory")
    if smallest.get("oom_by") == "budget" and peak is not None and budget:
        return (f"the smallest probe ({what} {smallest['value']}) peaks at "
                f"{peak / 2**20:.1f} MiB per device, over a budget of {budget / 2**20:.1f} MiB")
    return f"the smallest probe ({what} {smallest['value']}) ran out of memory: " \
           f"{smallest.get('reason')}"


def probe_words(verdict: dict[str, Any]) -> str:
    """A probe's progress line from its verdict (judge): fits, over budget, out of memory, or
    the run's own status and reason."""
    peak = verdict.get("peak_bytes")
    at = f": peak {peak / 2**20:.1f} MiB per device" if peak is not None else ""
    if verdict["fits"]:
        return f"fits{at}"
    if verdict.get("oom_by") == "budget":
        return f"over budget: {verdict['reason']}"
    return f"{verdict['status']}: {verdict['reason']}"
