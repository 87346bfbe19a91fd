"""The parent's check that a run's model state is split over its devices as its strategy says.

A runner reports `state_bytes_per_device` ({device: {"params", "grads", "optimizer": bytes}})
and `state_bytes_global` (each part's logical, unsharded size), both read from the framework's
own shards (DTensor local shards, ZeroRedundancyOptimizer's partition, DeepSpeed's partitioned
groups, jax arrays' addressable_shards). What its strategy shards is the catalog's
(contract.catalog.expected_shards: ZeRO-1 the optimizer state, ZeRO-2 also the gradients,
ZeRO-3/FSDP all three, plain data parallelism nothing). On 2+ devices a sharded part must be
held as at most its 1/N share on every device (with slack for the padding frameworks add and
the small leaves some leave replicated: SLACK_SHARE of the share plus SLACK_GLOBAL of the
whole; plus the runner's `state_granularity_bytes` of the part where its framework shards by
whole tensors, as ZeroRedundancyOptimizer assigns whole parameters), and the shards together
must cover the whole; a replicated part must be whole on every
device. Otherwise the run is `invalid`, the bytes in the reason. A part whose global size is 0
(gradients a strategy frees before the reading, no optimizer state) is not judged, and the
record says so.

Framework-free: the parent imports it (bench/run/verdict.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PARTS = ("params", "grads", "optimizer")
SLACK_SHARE = 0.10  # of the 1/N share: FSDP2 pads dim 0 to a multiple of N, ZeRO aligns
SLACK_GLOBAL = 0.02  # of the whole: small leaves (biases, norms) a strategy keeps replicated
WHOLE = 0.98  # a replica (or the shards together) holds at least this much of the whole


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def check_state_split(result: Mapping[str, Any], shards: tuple[str, ...], num_devices: int
                      ) -> tuple[dict[str, Any] | None, list[str]]:
    """(the check's view for the record, the problems) of a benchmark result whose strategy
    shards `shards` over `num_devices` devices. No view and no problem where the runner
    reports no state and shards nothing (a baseline that does not read its state)."""
    per_device = result.get("state_bytes_per_device")
    whole = result.get("state_bytes_global")
    if per_device is None and whole is None:
        if shards and num_devices > 1:
            return None, [f"the strategy shards {', '.join(shards)} but the run reports no "
                          "state_bytes_per_device: the split is not shown"]
        return None, []
    if not isinstance(per_device, Mapping) or not isinstance(whole, Mapping):
        return None, ["state_bytes_per_device / state_bytes_global are not objects"]
    problems: list[str] = []
    if len(per_device) != num_devices:
        problems.append(f"state_bytes_per_device names {len(per_device)} devices, the run has "
                        f"{num_devices}")
    view: dict[str, Any] = {"devices": len(per_device), "sharded": list(shards), "parts": {}}
    granularity = result.get("state_granularity_bytes")
    granularity = granularity if isinstance(granularity, Mapping) else {}
    for part in PARTS:
        g = _int(whole.get(part))
        held: dict[Any, Any] = {d: _int(v.get(part)) if isinstance(v, Mapping) else None
                                for d, v in per_device.items()}
        bad = sorted(d for d, b in held.items() if b is None)
        if g is None or bad:
            problems.append(f"{part}: not a byte count (global {whole.get(part)!r}, devices "
                            f"{', '.join(bad) or '-'})")
            continue
        sharded = part in shards
        entry: dict[str, Any] = {"global": g, "max_per_device": max(held.values(), default=0),
                                 "expected": "1/N" if sharded else "replica"}
        view["parts"][part] = entry
        if g == 0:
            entry["judged"] = "no (0 bytes: not held when read)"
            continue
        if num_devices < 2:
            continue
        if sharded:
            limit = g / num_devices * (1 + SLACK_SHARE) + g * SLACK_GLOBAL \
                + (_int(granularity.get(part)) or 0)
            over = {d: b for d, b in held.items() if b > limit}
            if over:
                problems.append(
                    f"{part} should be sharded over {num_devices} devices (at most "
                    f"{_mib(limit)} each of {_mib(g)}) but "
                    + ", ".join(f"{d} holds {_mib(b)}" for d, b in sorted(over.items())))
            total = sum(held.values())
            if total < WHOLE * g:
                problems.append(f"{part}: the devices' shards add up to {_mib(total)}, less "
                                f"than the whole {_mib(g)}")
        else:
            short = {d: b for d, b in held.items() if b < WHOLE * g}
            if short:
                problems.append(
                    f"{part} should be a full replica ({_mib(g)}) on every device but "
                    + ", ".join(f"{d} holds {_mib(b)}" for d, b in sorted(short.items())))
    return view, problems
