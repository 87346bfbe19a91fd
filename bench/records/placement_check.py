"""The parent's check of where a run's work ran, from what the framework reported.

A runner reports `placement` ({device as its framework names it: a positive count of compute
ops, rows or shards}). Frameworks name one device several ways ("/job:localhost/replica:0/
task:0/device:CPU:1", "/cpu:1", "cpu(1)", "TFRT_CPU_1"), so the check first normalises every
name (`normalise_device`) and counts the distinct devices: N keys that name fewer than N
devices do not pass. Where the runner knows each device's share of the work it reports
`expected_work` ({field: {device: expected count, or an inclusive [low, high] where the
framework's own optimiser may legitimately merge work}}, e.g. the Keras towers' forward
convolutions per device, one tower's worth each) beside the measured field ({device: count}
read from the framework); every device's measured count must be its expected one (a device
missing from either side counts 0). The record keeps both (`placement_check`).

Framework-free: the parent imports it (bench/run/launch.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_TF_FULL = re.compile(r"^/job:(?P<job>[^/]+)/replica:\d+/task:(?P<task>\d+)"
                      r"/device:(?P<kind>[A-Za-z_]+):(?P<index>\d+)$")
_SHORT = re.compile(r"^/?(device:)?(?P<kind>[A-Za-z_]+)[:_](?P<index>\d+)$")
_MXNET = re.compile(r"^(?P<kind>cpu|gpu|cpu_pinned|cpu_shared)\((?P<index>\d+)\)$")
_JAX_TFRT = re.compile(r"^TFRT_(?P<kind>[A-Z]+)_(?P<index>\d+)$")
_JAX_REPR = re.compile(r"^(?P<kind>[A-Za-z]+)Device\(id=(?P<index>\d+)\)$")
_PROCESS = re.compile(r"^(?P<base>.+) \(process (?P<process>\d+)\)$")
_RANK = re.compile(r"^rank(?P<rank>\d+):(?P<device>.+)$")
_KINDS = {"cuda": "gpu", "rocm": "gpu", "xla_gpu": "gpu", "xla_cpu": "cpu"}


def _kind(kind: str) -> str:
    k = kind.lower()
    return _KINDS.get(k, k)


def normalise_device(name: str) -> str:
    """One spelling per device: "cpu:1", "gpu:0"; a worker's device "worker/task:1/cpu:0";
    a torch or Horovod rank's "rank1/cpu" (each rank is its own process and device); a JAX
    device of another process "process1/cpu:2048". Unknown forms come back lower-cased."""
    name = str(name).strip()
    m = _PROCESS.match(name)
    if m:
        return f"process{m['process']}/{normalise_device(m['base'])}"
    m = _RANK.match(name)
    if m:
        device = m["device"]
        inner = normalise_device(device) if re.search(r"\d", device) else _kind(device)
        return f"rank{m['rank']}/{inner}"
    m = _TF_FULL.match(name)
    if m:
        local = f"{_kind(m['kind'])}:{m['index']}"
        return local if m["job"] == "localhost" else f"{m['job']}/task:{m['task']}/{local}"
    for pattern in (_MXNET, _JAX_TFRT, _JAX_REPR, _SHORT):
        m = pattern.match(name)
        if m:
            return f"{_kind(m['kind'])}:{int(m['index'])}"
    return name.lower()


def distinct_devices(placement: Mapping[str, Any]) -> list[str]:
    """The distinct devices a placement names (normalised), those with positive counts."""
    return sorted({normalise_device(k) for k, v in placement.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0})


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _per_device(counts: Any, ranges: bool = False) -> dict[str, Any] | None:
    """{normalised device: count} (or, with ranges, a count or an inclusive [low, high]),
    None when counts is not such a mapping."""
    if not isinstance(counts, Mapping):
        return None
    out: dict[str, Any] = {}
    for k, v in counts.items():
        if ranges and isinstance(v, (list, tuple)) and len(v) == 2 and all(map(_number, v)):
            v = [v[0], v[1]]
        elif not _number(v):
            return None
        key = normalise_device(k)
        if key in out:  # two names of one device: their counts add up
            if isinstance(v, list) or isinstance(out[key], list):
                return None
            v = out[key] + v
        out[key] = v
    return out


def _matches(got: float, want: Any) -> bool:
    return want[0] <= got <= want[1] if isinstance(want, list) else got == want


def _show(want: Any) -> str:
    return f"{_n(want[0])}..{_n(want[1])}" if isinstance(want, list) else _n(want)


def check_work(result: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """({field: {"measured", "expected"}} for the record, problems) for every field the
    result's `expected_work` names."""
    expected_work = result.get("expected_work")
    if expected_work is None:
        return {}, []
    if not isinstance(expected_work, Mapping):
        return {}, [f"expected_work is {type(expected_work).__name__}, not an object"]
    shown: dict[str, Any] = {}
    problems: list[str] = []
    for field, expected in expected_work.items():
        want, got = _per_device(expected, ranges=True), _per_device(result.get(field))
        if want is None or got is None:
            problems.append(f"{field}: no per-device counts to check ({result.get(field)!r} "
                            f"against {expected!r})")
            continue
        shown[field] = {"measured": dict(sorted(got.items())),
                        "expected": dict(sorted(want.items()))}
        devices = sorted(set(want) | set(got))
        wrong = [d for d in devices if not _matches(got.get(d, 0), want.get(d, 0))]
        if wrong:
            problems.append(
                f"{field} is not the original's: "
                + ", ".join(f"{d} {_n(got.get(d, 0))} (expected {_show(want.get(d, 0))})"
                            for d in devices))
    return shown, problems


def _n(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def check_placement(result: Mapping[str, Any], num_devices: int
                    ) -> tuple[dict[str, Any], list[str]]:
    """({"devices": distinct normalised devices, "work": check_work's}, problems) of a
    training result: its placement must name num_devices distinct devices (unless the
    framework itself collapsed them: `placement_collapsed`), with positive counts, and every
    expected_work field must match."""
    placement = result.get("placement")
    if not isinstance(placement, Mapping) or not placement:
        return {}, [f"no placement read back from the framework (placement={placement!r})"]
    bad = {k: v for k, v in placement.items()
           if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0}
    if bad:
        return {}, [f"placement counts must be positive numbers: {bad}"]
    devices = distinct_devices(placement)
    shown: dict[str, Any] = {"devices": devices}
    problems: list[str] = []
    if len(devices) < num_devices and not result.get("placement_collapsed"):
        same = "" if len(devices) == len(placement) else \
            f" ({len(placement)} names for {len(devices)} devices)"
        problems.append(f"the work did not spread over the {num_devices} devices: the "
                        f"framework placed it on {sorted(placement)}{same}")
    work, work_problems = check_work(result)
    if work:
        shown["work"] = work
    return shown, problems + work_problems
