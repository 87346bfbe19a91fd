"""Thread settings: what a run actually used (child side); the policy is contract/launch_env.py's.
`observed()` (after the benchmark, runners.common.main) reads the thread variables, what each
imported framework reports and the CPU seconds of the busiest threads; it imports no framework
and never raises. Reasons: docs/runners/shared.md."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

from contract.launch_env import POLICY_VAR, THREAD_VARS, physical_cores


def _tensorflow(tf: Any) -> dict[str, Any]:
    threading = tf.config.threading
    return {"intra_op_parallelism_threads": threading.get_intra_op_parallelism_threads(),
            "inter_op_parallelism_threads": threading.get_inter_op_parallelism_threads(),
            "note": "0 means TensorFlow sizes the pool to the host"}


def _torch(torch: Any) -> dict[str, Any]:
    return {"num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads()}


def _mxnet(mx: Any) -> dict[str, Any]:
    features = mx.runtime.Features()
    out: dict[str, Any] = {
        "engine": os.environ.get("MXNET_ENGINE_TYPE", "ThreadedEnginePerDevice (default)"),
        "cpu_worker_nthreads": int(os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")),
        **{name.lower(): features.is_enabled(name) for name in ("MKLDNN", "OPENMP")},
        "blas": next((n[5:].lower() for n in ("BLAS_OPEN", "BLAS_MKL", "BLAS_ATLAS",
                                              "BLAS_APPLE") if features.is_enabled(n)), None),
    }
    omp = openmp_max_threads()
    if omp is not None:
        # MXNet sets this at load (openmp.cc); its engine workers use the same count
        out["openmp_max_threads"] = omp
    return out


def _jax(jax: Any) -> dict[str, Any]:
    # XLA's CPU thread pool has no query API: its flags say everything the run changed
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "version": jax.__version__}


# each imported framework's own answer, by module name (the record's key)
PROBES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "tensorflow": _tensorflow, "torch": _torch, "mxnet": _mxnet, "jax": _jax}


def openmp_max_threads() -> int | None:
    """omp_get_max_threads() of the GNU OpenMP runtime this process already loaded (None if
    none is loaded)."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        with contextlib.suppress(OSError, AttributeError):
            return int(ctypes.CDLL(path).omp_get_max_threads())
    return None


def busiest_threads(top: int = 4) -> list[float]:
    """CPU seconds (user + system) of this process's busiest threads so far, most first (Linux
    /proc; empty elsewhere)."""
    ticks = os.sysconf("SC_CLK_TCK")
    times = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            times.append((int(fields[11]) + int(fields[12])) / ticks)  # utime, stime
    return [round(t, 2) for t in sorted(times, reverse=True)[:top]]


def observed() -> dict[str, Any]:
    """The run's thread settings: the thread variables of its environment, the policy's note,
    the cores it may use, and each already-imported framework's own answer. Never raises."""
    out: dict[str, Any] = {}
    try:
        out["env"] = {k: os.environ[k] for k in THREAD_VARS if k in os.environ}
        out["policy"] = os.environ.get(POLICY_VAR)
        out["physical_cores"] = physical_cores()
        with contextlib.suppress(AttributeError, OSError):
            out["cpus_allowed"] = len(os.sched_getaffinity(0))
        out["busiest_threads_cpu_s"] = busiest_threads()
        for name, probe in PROBES.items():
            if name in sys.modules:
                try:
                    out[name] = probe(sys.modules[name])
                except Exception as exc:  # evidence, never a reason to lose a run
                    out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return out
