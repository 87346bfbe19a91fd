"""Child side of mode allreduce (the communication probe), shared by every family's probe: the
buffer sizes, the timed loop, and the figures as nccl-tests defines them.

A probe module (runners/<family>/allreduce_probe.py) defines `benchmark(spec) -> dict` that
builds its framework's own all-reduce over spec.num_devices replicas, and for each size of
`probe_sizes(spec.model)` calls `measure_size(...)`; it returns `probe_result(...)`. Nothing
here imports a framework.

Definitions (nccl-tests, doc/PERFORMANCE.md): a sum all-reduce of S bytes that takes t seconds
has algorithm bandwidth algbw = S / t and bus bandwidth busbw = algbw x 2(n-1)/n, the figure
comparable to a link's bandwidth whatever n is (a ring all-reduce moves 2(n-1)/n x S bytes
through every rank's link). t is the mean over the timed iterations of one all-reduce; across
ranks the slowest rank's time counts (the collective is done when every rank is). GB/s are
1e9 bytes per second, as nccl-tests prints them; sizes are binary (1 MiB = 2**20 bytes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from models import get_spec

MIB = 1 << 20
DTYPE_BYTES = 4  # float32 gradients, what every runner's all-reduce moves
SMALLEST = MIB


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


def measure_size(nbytes: int, n: int, allreduce: Callable[[], Any], sync: Callable[[Any], None],
                 warmup: int, iters: int, slowest: Callable[[float], float] = float,
                 check: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Time `iters` calls of `allreduce` (after `warmup` untimed ones) on one buffer of nbytes:
    the calls are issued back to back and `sync` waits for the last one's result, as
    nccl-tests times a batch of iterations. `slowest` turns this rank's mean time into the
    slowest rank's (a max across ranks in the framework's own collective; identity in one
    process). `check`, called before timing, says whether one all-reduce gave the right sum
    (its answer is the row's `correct`)."""
    correct = check() if check is not None else None
    out = None
    for _ in range(warmup):
        out = allreduce()
    if out is not None:
        sync(out)
    start = time.perf_counter()
    for _ in range(iters):
        out = allreduce()
    sync(out)
    mean = slowest((time.perf_counter() - start) / iters)
    return {"bytes": nbytes, "elements": nbytes // DTYPE_BYTES, "iters": iters,
            **figures(nbytes, mean, n), "correct": correct}


def probe_result(rows: list[dict[str, Any]], model: str, implementation: str,
                 evidence: dict[str, Any], framework: dict[str, str]) -> dict[str, Any]:
    """The result a probe returns: its rows, the figure at the model's gradient size, and the
    evidence read back from the framework (world size, backend, the devices the buffers lived
    on), which the parent checks against the run's device count."""
    top = gradient_bytes(model)
    at_top = next((r for r in rows if r["bytes"] == top), None)
    return {
        "allreduce": {
            "implementation": implementation,
            "op": "sum", "dtype": "float32",
            "gradient_bytes": top,
            "busbw_gbps": at_top["busbw_gbps"] if at_top else None,
            "algbw_gbps": at_top["algbw_gbps"] if at_top else None,
            "time_s": at_top["time_s"] if at_top else None,
            "sizes": rows,
            "evidence": evidence,
        },
        "framework": framework,
    }
