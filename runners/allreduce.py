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
So here: `warmup` untimed calls, `sync`, `barrier`, `iters` timed calls back to back, `sync`
on the last; t = elapsed / iters on each rank, and `across_ranks` gives the mean of the ranks'
t (identity in one process: one process times all replicas at once). GB/s are 1e9 bytes per
second as nccl-tests prints them; sizes are binary (1 MiB = 2**20 bytes). The timed buffer
holds zeros, so repeated in-place sums never overflow; the check fills a buffer of the same
size with rank + 1 and expects n(n+1)/2 everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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


def bus_factor(n: int) -> float:
    """nccl-tests' all-reduce bus bandwidth factor, 2(n-1)/n (0 for one rank)."""
    return 2 * (n - 1) / n


def figures(nbytes: int, seconds: float, n: int) -> dict[str, float]:
    """algbw and busbw in GB/s (1e9) of one all-reduce of nbytes over n ranks in seconds."""
    algbw = nbytes / seconds / 1e9
    return {"time_s": seconds, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(n)}


def expected_sum(n: int) -> float:
    """What the check's all-reduce gives everywhere: the sum of rank + 1 over n ranks."""
    return n * (n + 1) / 2


def measure_size(nbytes: int, n: int, allreduce: Callable[[], Any], sync: Callable[[Any], None],
                 warmup: int, iters: int,
                 across_ranks: Callable[[float], float] = float,
                 check: Callable[[], bool] | None = None,
                 barrier: Callable[[], None] | None = None) -> dict[str, Any]:
    """One row: `check` (if given) says whether one all-reduce of rank + 1 gave n(n+1)/2 on
    every replica (its answer, combined over the ranks by the probe, is the row's `correct`);
    then `warmup` untimed calls of `allreduce` on the buffer of nbytes, `sync` on the last,
    `barrier` (all ranks start the clock together, as nccl-tests' Barrier), `iters` timed
    calls issued back to back and `sync` on the last one's result. This rank's mean time is
    turned by `across_ranks` into the mean over the ranks (nccl-tests' default -a 1, a
    collective in the framework; identity in one process)."""
    if iters < 1:
        raise ValueError(f"iters={iters}: nothing to time")
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
    return {"bytes": nbytes, "elements": nbytes // DTYPE_BYTES, "iters": iters,
            "warmup": warmup, **figures(nbytes, mean, n), "correct": correct}


def probe_result(rows: list[dict[str, Any]], model: str, implementation: str,
                 evidence: dict[str, Any], framework: dict[str, str],
                 window: tuple[float, float] | None = None, **extra: Any) -> dict[str, Any]:
    """The result a probe returns: its rows, the figure at the model's gradient size, and the
    evidence read back from the framework (`replicas`, `devices`, `source`; backend and what
    else the framework says), which the parent checks against the run's device count.
    `window`: the wall-clock (time.time()) start and end of the measurements, for the
    parent's telemetry. `extra`: more of what the probe wants to say of itself."""
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
    if window is not None:
        out["window_start"], out["window_end"] = window
    return out
