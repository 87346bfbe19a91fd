"""Measure a device's peak matrix-multiply throughput in one framework at one precision.

`python -m runners.peak_probe --framework torch --device cpu --precision fp32 --result OUT`
times chains of n x n matmuls (each consumes the previous product) and writes the best trial's
FLOP/s, whether the best three agreed and the CPU share others took; bench/run/peak.py caches
only an agreed, uncontended peak."""

from __future__ import annotations

import argparse
import operator
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from bench.records.mfu import AGREE, spread
from bench.run.environment import cpu_model
from runners import math_mode
from runners.common import Unavailable, write_json_atomic

DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
MIN_MATMUL_S = 0.02  # calibrate n up to where one matmul takes this long
MAX_N = {"cpu": 4096, "gpu": 8192}
# A backend gets (device, dtype name) and returns (version, device name, setup); setup(n)
# builds the operands and returns run(k): k chained matmuls, then a device sync.
Run = Callable[[int], None]
Setup = Callable[[int], Run]
Backend = Callable[[str, str], tuple[str, str, Setup]]


def _one_line(exc: BaseException) -> str:
    """The exception's name and the first informative line of its message."""
    # MXNet's messages open with a C++ traceback header; the check that failed comes after
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = next((ln for ln in lines if not ln.startswith(("Traceback", "File "))), "")
    name = type(exc).__name__
    return (text if text.startswith(f"{name}:") else f"{name}: {text}")[:300]


def _chain(a: Any, b: Any, product: Callable[[Any, Any], Any], wait: Callable[[Any], Any]
           ) -> Run:
    """run(k): k chained products from `a` (c = product(c, b)), then wait(c), a device sync."""

    def run(k: int) -> None:
        c = a
        for _ in range(k):
            c = product(c, b)
        wait(c)
    return run


def _torch(device: str, dtype: str) -> tuple[str, str, Setup]:
    import torch

    if device == "gpu" and not torch.cuda.is_available():
        raise Unavailable("torch sees no CUDA GPU")
    dev = torch.device("cuda:0" if device == "gpu" else "cpu")
    sync = torch.cuda.synchronize if device == "gpu" else (lambda: None)

    def setup(n: int) -> Run:
        gen = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn(n, n, generator=gen, device=dev).to(getattr(torch, dtype))
        # scaled by 1/sqrt(n) so a chain of products keeps entries near 1 (no inf, no denormal)
        b = (torch.randn(n, n, generator=gen, device=dev) / n**0.5).to(getattr(torch, dtype))
        return torch.no_grad()(_chain(a, b, operator.matmul, lambda c: sync()))
    name = torch.cuda.get_device_name(0) if device == "gpu" else cpu_model()
    return torch.__version__, name, setup


def _jax(device: str, dtype: str) -> tuple[str, str, Setup]:
    import jax

    try:
        dev = jax.devices("gpu" if device == "gpu" else "cpu")[0]
    except RuntimeError as exc:
        raise Unavailable(f"jax has no {device} device: {exc}") from exc
    step = jax.jit(lambda c, b: c @ b)

    def setup(n: int) -> Run:
        ka, kb = jax.random.split(jax.random.PRNGKey(0))
        a = jax.device_put(jax.random.normal(ka, (n, n)).astype(dtype), dev)
        b = jax.device_put((jax.random.normal(kb, (n, n)) / n**0.5).astype(dtype), dev)
        return _chain(a, b, step, lambda c: c.block_until_ready())
    return jax.__version__, dev.device_kind if device == "gpu" else cpu_model(), setup


def _tf(device: str, dtype: str) -> tuple[str, str, Setup]:
    import tensorflow as tf

    name = cpu_model()
    if device == "gpu":  # listing GPUs initialises them all: only when the run is on GPU
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise Unavailable("tensorflow sees no GPU")
        name = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "gpu")
    place = "/GPU:0" if device == "gpu" else "/CPU:0"

    def setup(n: int) -> Run:
        with tf.device(place):
            gen = tf.random.Generator.from_seed(0)
            a = tf.cast(gen.normal((n, n)), dtype)
            b = tf.cast(gen.normal((n, n)) / n**0.5, dtype)

        def run(k: int) -> None:
            with tf.device(place):
                c = a
                for _ in range(k):
                    c = tf.matmul(c, b)
                c[0, 0].numpy()  # waits for the whole chain
        return run
    return tf.__version__, name, setup


def _mxnet(device: str, dtype: str) -> tuple[str, str, Setup]:
    import mxnet as mx

    if device == "gpu" and mx.context.num_gpus() < 1:
        raise Unavailable("mxnet sees no GPU")
    ctx = mx.gpu(0) if device == "gpu" else mx.cpu()

    def setup(n: int) -> Run:
        mx.random.seed(0)
        a = mx.nd.random.normal(shape=(n, n), ctx=ctx).astype(dtype)
        b = (mx.nd.random.normal(shape=(n, n), ctx=ctx) / n**0.5).astype(dtype)
        return _chain(a, b, mx.nd.dot, lambda c: mx.nd.waitall())
    return mx.__version__, "gpu(0)" if device == "gpu" else cpu_model(), setup


BACKENDS: dict[str, Backend] = {"torch": _torch, "jax": _jax, "tf": _tf, "mxnet": _mxnet}
MODULES = {"torch": "torch", "jax": "jax", "tf": "tensorflow", "mxnet": "mxnet"}


def _timed(run: Run, k: int) -> float:
    t0 = time.perf_counter()
    run(k)
    return time.perf_counter() - t0


def measure(framework: str, device: str, precision: str, seconds: float) -> dict[str, Any]:
    """Calibrate n, then time chains of matmuls for about `seconds`; the best trial wins."""
    dtype, start = DTYPES[precision], time.perf_counter()
    try:
        version, name, setup = BACKENDS[framework](device, dtype)
    except ImportError as exc:
        raise Unavailable(f"{MODULES[framework]} is not installed here: {exc}") from exc
    try:  # fp32 IEEE, tf32 on tensor cores: the math the runs at this precision get
        math_mode.apply(precision, device)
    except math_mode.MathModeUnavailable as exc:
        raise Unavailable(str(exc)) from exc
    try:  # a dtype the framework cannot multiply on this device fails here, on a tiny case
        setup(64)(1)
    except Exception as exc:
        raise Unavailable(f"{framework} cannot multiply {dtype} matrices on {device}: "
                          f"{_one_line(exc)}") from exc
    n = 256
    while True:
        run = setup(n)
        run(1)  # first call at a size: allocation, compilation, kernel selection
        per = _timed(run, 2) / 2
        if per >= MIN_MATMUL_S or n * 2 > MAX_N[device]:
            break
        n *= 2
    k = max(2, round(seconds / 5 / per))
    before = _cpu_times() if device == "cpu" else None
    trials = _trials(lambda: k * 2 * n**3 / _timed(run, k), seconds)
    return {"status": "ok", "peak_flops": max(trials), "n": n, "dtype": dtype,
            "framework": framework, "framework_version": version, "device_name": name,
            "matmuls_per_trial": k, "trials_flops": trials, "spread": spread(trials),
            "agreed": spread(trials) <= AGREE, "agree_within": AGREE,
            "others_cpu_share": _others_share(before) if before else None,
            "math": math_mode.read_back(), "seconds": round(time.perf_counter() - start, 3)}


def _trials(trial: Callable[[], float], seconds: float) -> list[float]:
    """At least 3 trials over `seconds`; then on, up to 3 x `seconds`, until the best three
    agree within AGREE (a busy moment makes one slow trial, not three fast ones)."""
    trials: list[float] = []
    t0 = time.perf_counter()
    while len(trials) < 3 or (time.perf_counter() - t0 < seconds and len(trials) < 20) or (
            spread(trials) > AGREE and time.perf_counter() - t0 < 3 * seconds
            and len(trials) < 60):
        trials.append(trial())
    return trials


def _cpu_times() -> tuple[float, float, float] | None:
    """(wall seconds, the machine's busy CPU seconds from /proc/stat, this process's); None
    where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return time.monotonic(), busy, own.user + own.system


def _others_share(before: tuple[float, float, float]) -> float | None:
    """The share of the machine's CPU time other processes used while the trials ran."""
    after = _cpu_times()
    if after is None:
        return None
    wall, busy, own = (b - a for a, b in zip(before, after, strict=True))
    capacity = wall * (os.cpu_count() or 1)
    return round(max(0.0, busy - own) / capacity, 3) if capacity > 0 else None


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure, write the result JSON; exit 1 only on an unexpected error."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", required=True, choices=sorted(BACKENDS))
    ap.add_argument("--device", required=True, choices=sorted(MAX_N))
    ap.add_argument("--precision", required=True, choices=sorted(DTYPES))
    ap.add_argument("--result", required=True)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args(argv)
    try:
        result = measure(args.framework, args.device, args.precision, args.seconds)
    except Unavailable as exc:
        write_json_atomic(args.result, {"status": "unavailable", "reason": str(exc)})
        return 0
    except Exception as exc:
        traceback.print_exc()
        write_json_atomic(args.result, {"status": "failed", "reason": _one_line(exc)})
        return 1
    write_json_atomic(args.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
