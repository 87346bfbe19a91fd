"""Child side of mode allreduce (the communication probe), shared by every family's probe: the
buffer sizes, the timed loop, the figures as nccl-tests defines them, and the result.

A probe module (runners/<family>/allreduce_probe.py) defines `benchmark(spec) -> dict` that
builds its framework's own all-reduce over spec.num_devices replicas, and for each size of
`probe_sizes(spec.model)` calls `measure_size(...)`; it returns `probe_result(...)`. Nothing
here imports a framework.

What the parent checks in an ok result (bench/run/launch.py, validate_allreduce): `allreduce.sizes`
holds one row per size of probe_sizes(spec.model), in order, each with `correct` True (the
framework's sum checked, every rank's check combined) and positive finite times and
bandwidths whose busbw is nccl-tests' with n = the run's device count; `allreduce.busbw_gbps`
is the row at the gradient size; `allreduce.evidence` was read back from the framework, never
from the spec: `replicas` (an int: world size, group size, number of contexts or devices the
collective spanned), `devices` (one entry per replica, each naming the device its buffer lived
on, all distinct: "rank1:cpu", "/device:CPU:1", "cpu(1)") and `source` (one line: which calls
said so).

Definitions, as nccl-tests computes them (github.com/NVIDIA/nccl-tests at a0b82b2, read for
this module):
- src/all_reduce.cu, AllReduceGetBw: algbw = S / 1e9 / t (S the buffer's bytes: count x the
  type's size), busbw = algbw x 2(n-1)/n, n the ranks. doc/PERFORMANCE.md explains the factor:
  any all-reduce built from sends and receives moves 2(n-1)/n x S bytes through every rank's
  link, so busbw is comparable to one link's bandwidth whatever n is.
- src/common.cu, BenchTime: one untimed collective and its completion, a barrier of all
  ranks, then `iters` collectives issued back to back (non-blocking, the default -z 0), one
  wait for the last (completeColl), t = the elapsed time / iters; TimeTest warms every size up
  first (-w, warmup_iters). Across ranks t is then combined by Allreduce(args, &deltaSec,
  average) with `average` = 1 by default (-a 1: "report average iteration time ... 1=AVG"):
  the mean of the ranks' times (-a 3 would be the slowest rank's). The data check is a
  separate collective of known data whose wrong elements are summed over the ranks.
- src/all_gather.cu and src/reduce_scatter.cu (AllGatherGetBw, ReduceScatterGetBw;
  *GetCollByteCount): the per-rank count is count/n rounded down to a multiple of 16 bytes'
  worth of elements, S = that x n x the type's size (the gathered buffer for all-gather, the
  input for reduce-scatter: doc/PERFORMANCE.md, "S is the size in bytes of the total array,
  sendcount*sizeof(datatype)*n"), algbw = S / 1e9 / t and busbw = algbw x (n-1)/n: each rank
  receives (n-1)/n x S. `collective_bytes` gives S for a probe size, and a row's `bytes` is S.
So here: `warmup` untimed calls, `sync`, `barrier`, `iters` timed calls back to back, `sync`
on the last; t = elapsed / iters on each rank, and `across_ranks` gives the mean of the ranks'
t (identity in one process: one process times all replicas at once). GB/s are 1e9 bytes per
second as nccl-tests prints them; sizes are binary (1 MiB = 2**20 bytes). The timed buffer
holds zeros, so repeated in-place sums never overflow; the check fills a buffer of the same
size with rank + 1 and expects n(n+1)/2 everywhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from models import get_spec

MIB = 1 << 20
DTYPE_BYTES = 4  # float32 gradients, what every runner's all-reduce moves
SMALLEST = MIB
TIME_ACROSS_RANKS = "mean"  # nccl-tests' default (-a 1)


def gradient_bytes(model: str) -> int:
    """The bytes one step's all-reduce moves: the model's trainable parameters in float32
    (ResNet-50: 25,557,032 x 4 = 102.2 MB)."""
    return get_spec(model).trainable_params * DTYPE_BYTES


def probe_sizes(model: str) -> list[int]:
    """Buffer sizes in bytes: 1 MiB, doubling, up to and including the model's gradient size
    (the last size is the gradient size itself, a multiple of 4 bytes)."""
    top = gradient_bytes(model)
    sizes, size = [], SMALLEST
    while size < top:
        sizes.append(size)
        size *= 2
    return [*sizes, top]


ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"
COLLECTIVES = (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER)
ALIGN_BYTES = 16  # nccl-tests rounds the per-rank count down to 16 bytes (*GetCollByteCount)


def bus_factor(n: int, collective: str = ALL_REDUCE) -> float:
    """nccl-tests' bus bandwidth factor: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and
    reduce-scatter (0 for one rank)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    return (2 if collective == ALL_REDUCE else 1) * (n - 1) / n


def shard_elements(nbytes: int, n: int) -> int:
    """float32 elements of one rank's part of an all-gather / reduce-scatter of about nbytes
    in total over n ranks, as nccl-tests sizes it: count / n rounded down to 16 bytes."""
    per = ALIGN_BYTES // DTYPE_BYTES
    return (nbytes // DTYPE_BYTES // n) // per * per


def collective_bytes(nbytes: int, n: int, collective: str = ALL_REDUCE) -> int:
    """S, the bytes nccl-tests' figures use, for a probe size: the buffer itself for an
    all-reduce; n x one rank's (16-byte aligned) part for all-gather and reduce-scatter."""
    if collective == ALL_REDUCE:
        return nbytes
    bus_factor(n, collective)  # the name's check
    return shard_elements(nbytes, n) * n * DTYPE_BYTES


def figures(nbytes: int, seconds: float, n: int,
            collective: str = ALL_REDUCE) -> dict[str, float]:
    """algbw and busbw in GB/s (1e9) of one collective of S = nbytes over n ranks in seconds."""
    algbw = nbytes / seconds / 1e9
    return {"time_s": seconds, "algbw_gbps": algbw,
            "busbw_gbps": algbw * bus_factor(n, collective)}


def expected_sum(n: int) -> float:
    """What the check's all-reduce gives everywhere: the sum of rank + 1 over n ranks."""
    return n * (n + 1) / 2


def expected_gather(n: int) -> list[float]:
    """What the check's all-gather gives everywhere: rank r's part (filled with r + 1) at
    position r, so the parts' values 1, 2, ..., n in rank order. (The check's reduce-scatter
    sums rank + 1 like the all-reduce: every rank's part is expected_sum(n).)"""
    return [float(r + 1) for r in range(n)]


@dataclass(frozen=True)
class Around:
    """What a probe adds around its timed calls: `check` (one collective checked first),
    `barrier` (the ranks start the clock together) and `across_ranks` (this rank's mean time
    to the mean over the ranks)."""

    check: Callable[[], bool] | None = None
    barrier: Callable[[], None] | None = None
    across_ranks: Callable[[float], float] = float


def measure_size(nbytes: int, n: int, allreduce: Callable[[], Any], sync: Callable[[Any], None],
                 warmup: int, iters: int, around: Around = Around(),
                 collective: str = ALL_REDUCE) -> dict[str, Any]:
    """One row: `check` (if given) says whether one collective of rank + 1 gave what it
    should on every replica (n(n+1)/2 for all-reduce and reduce-scatter, expected_gather
    for all-gather; its answer, combined over the ranks by the probe, is the row's `correct`);
    then `warmup` untimed calls of `allreduce` on the buffer of nbytes, `sync` on the last,
    `barrier` (all ranks start the clock together, as nccl-tests' Barrier), `iters` timed
    calls issued back to back and `sync` on the last one's result. This rank's mean time is
    turned by `across_ranks` into the mean over the ranks (nccl-tests' default -a 1, a
    collective in the framework; identity in one process). `allreduce` is the timed call of
    whichever `collective` the row is of; nbytes is that collective's S (collective_bytes)."""
    if iters < 1:
        raise ValueError(f"iters={iters}: nothing to time")
    check, barrier, across_ranks = around.check, around.barrier, around.across_ranks
    correct = check() if check is not None else None
    out = None
    for _ in range(warmup):
        out = allreduce()
    if out is not None:
        sync(out)
    if barrier is not None:
        barrier()
    start = time.perf_counter()
    for _ in range(iters):
        out = allreduce()
    sync(out)
    mean = across_ranks((time.perf_counter() - start) / iters)
    row = {"bytes": nbytes, "elements": nbytes // DTYPE_BYTES, "iters": iters,
           "warmup": warmup, **figures(nbytes, mean, n, collective), "correct": correct}
    if collective != ALL_REDUCE:
        row["shard_elements"] = nbytes // DTYPE_BYTES // n
    return row


def probe_result(rows: list[dict[str, Any]], model: str, implementation: str,
                 evidence: dict[str, Any], framework: dict[str, str],
                 window: tuple[float, float] | None = None,
                 collectives: dict[str, dict[str, Any]] | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The result a probe returns: its rows, the figure at the model's gradient size, and the
    evidence read back from the framework (`replicas`, `devices`, `source`; backend and what
    else the framework says), which the parent checks against the run's device count.
    `window`: the wall-clock (time.time()) start and end of the measurements, for the
    parent's telemetry. `collectives`: the all-gather and reduce-scatter sections
    (collective_section / unavailable_section) by name. `extra`: more of what the probe wants
    to say of itself."""
    top = gradient_bytes(model)
    at_top = next((r for r in rows if r["bytes"] == top), None)
    out: dict[str, Any] = {
        "allreduce": {
            "implementation": implementation,
            "op": "sum", "dtype": "float32",
            "gradient_bytes": top,
            "busbw_gbps": at_top["busbw_gbps"] if at_top else None,
            "algbw_gbps": at_top["algbw_gbps"] if at_top else None,
            "time_s": at_top["time_s"] if at_top else None,
            "time_across_ranks": TIME_ACROSS_RANKS,
            "sizes": rows,
            "evidence": evidence,
        },
        "framework": framework,
        **extra,
    }
    if collectives is not None:
        out["collectives"] = collectives
    if window is not None:
        out["window_start"], out["window_end"] = window
    return out


def collective_section(rows: list[dict[str, Any]], model: str, n: int, collective: str,
                       implementation: str) -> dict[str, Any]:
    """One all-gather or reduce-scatter's section of `collectives`: its rows (one per probe
    size, `bytes` = nccl-tests' S), and the figure at the model's gradient size."""
    top = collective_bytes(gradient_bytes(model), n, collective)
    at_top = next((r for r in rows if r["bytes"] == top), None)
    return {"collective": collective, "status": "ok", "implementation": implementation,
            "dtype": "float32", "op": "sum" if collective == REDUCE_SCATTER else None,
            "gradient_bytes": top,
            "busbw_gbps": at_top["busbw_gbps"] if at_top else None,
            "algbw_gbps": at_top["algbw_gbps"] if at_top else None,
            "time_s": at_top["time_s"] if at_top else None,
            "time_across_ranks": TIME_ACROSS_RANKS, "sizes": rows}


def unavailable_section(collective: str, reason: str) -> dict[str, Any]:
    """A collective the framework does not have (or refused): its name and the reason."""
    return {"collective": collective, "status": "unavailable", "reason": reason}


def measure_collective(collective: str, model: str, n: int,
                       run: Callable[[int], dict[str, Any]],
                       implementation: str) -> dict[str, Any]:
    """Every probe size of one collective, `run(total_bytes)` measuring one row (it calls
    measure_size); a framework error at the first size makes the section unavailable with the
    framework's own message (its first line), never a traceback."""
    rows = []
    for size in probe_sizes(model):
        try:
            rows.append(run(collective_bytes(size, n, collective)))
        except Exception as exc:  # noqa: BLE001 (the framework's refusal is the data)
            if rows:
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            return unavailable_section(collective, f"{type(exc).__name__}: {first}"[:300])
    return collective_section(rows, model, n, collective, implementation)


def check_collectives(result: dict[str, Any], n: int, model: str) -> list[str]:
    """The parent's check of an ok probe result's `collectives` (none: nothing to check, as
    in records from before issue 27): every section is a known collective other than
    all_reduce; an unavailable one gives its reason; an ok one has a row for every probe size
    with `bytes` = nccl-tests' S for n ranks, checked correct, positive times and nccl-tests'
    algbw and busbw, and its figure at the gradient size."""
    sections = result.get("collectives")
    if sections is None:
        return []
    if not isinstance(sections, dict):
        return [f"collectives is {type(sections).__name__}, not a mapping"]
    problems = []
    for name, sec in sections.items():
        if name not in COLLECTIVES or name == ALL_REDUCE:
            problems.append(f"collectives holds {name!r}, not one of all_gather, reduce_scatter")
            continue
        if not isinstance(sec, dict):
            problems.append(f"{name}: section is {sec!r}")
            continue
        if sec.get("status") == "unavailable":
            if not sec.get("reason"):
                problems.append(f"{name} is unavailable without a reason")
            continue
        rows = sec.get("sizes")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            problems.append(f"{name}: no measured sizes (sizes={rows!r})")
            continue
        want = [collective_bytes(s, n, name) for s in probe_sizes(model)]
        got = [r.get("bytes") for r in rows]
        if got != want:
            problems.append(f"{name}: sizes {got} are not nccl-tests' S of the probe's sizes "
                            f"for {model} over {n} ranks: {want}")
        for row in rows:
            size, t = row.get("bytes"), row.get("time_s")
            alg, bus = row.get("algbw_gbps"), row.get("busbw_gbps")
            if row.get("correct") is not True:
                problems.append(f"{name} of {size!r} bytes gave wrong data "
                                f"(correct={row.get('correct')!r})")
            nums = (size, t, alg, bus)
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       and math.isfinite(v) and v > 0 for v in nums):
                problems.append(f"{name} size {size!r}: time {t!r} s, algbw {alg!r}, busbw "
                                f"{bus!r} GB/s are not all positive finite numbers")
                continue
            want_alg = size / t / 1e9
            if not (math.isclose(alg, want_alg, rel_tol=1e-6) and
                    math.isclose(bus, want_alg * bus_factor(n, name), rel_tol=1e-6)):
                problems.append(f"{name} size {size}: algbw {alg:.6g} and busbw {bus:.6g} GB/s"
                                f" are not nccl-tests' ({want_alg:.6g}, "
                                f"{want_alg * bus_factor(n, name):.6g})")
        top = next((r for r in rows if r.get("bytes") == sec.get("gradient_bytes")), None)
        if top is None or sec.get("busbw_gbps") != top.get("busbw_gbps"):
            problems.append(f"{name}: busbw_gbps {sec.get('busbw_gbps')!r} is not the row at "
                            "the gradient size")
    return problems
