"""What the parent puts into a child's environment, and where a rank's side file goes: the
float32 math switch (NVIDIA_TF32_OVERRIDE, JAX's default matmul precision: runners/math_mode.py
applies the rest in the child), the thread policy (runners/threads.py reads back what the run
used) and the memory side file of ranks other than 0 (runners/memory.py). Stdlib only."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path

STRICT, TF32 = "ieee", "tf32"


def _want(precision: str) -> str | None:
    return {"fp32": STRICT, "tf32": TF32}.get(precision)


def math_env(precision: str, device: str, environ: dict[str, str]) -> dict[str, str]:
    """The environment a GPU run at this precision needs (no framework imported): the library
    switch, and JAX's default precision (JAX may be imported after runners.common.main starts,
    and reads its config from the environment when it is)."""
    if device != "gpu":
        return dict(environ)
    env = dict(environ)
    if precision == "tf32":
        env.pop("NVIDIA_TF32_OVERRIDE", None)
    else:
        env["NVIDIA_TF32_OVERRIDE"] = "0"
    want = _want(precision)
    if want is not None:
        env["JAX_DEFAULT_MATMUL_PRECISION"] = "tensorfloat32" if want == TF32 else "highest"
    return env


POLICY_VAR = "MGBENCH_THREAD_POLICY"  # the user's "off", or the harness's note of what it set
OFF = ("off", "0", "false", "none")
ALL_CORES = "all-cores"  # the policy over every core, whatever other processes hold at launch
THREAD_VARS = (
    "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY",
    "KMP_BLOCKTIME", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "MXNET_CPU_WORKER_NTHREADS", "MXNET_OMP_MAX_THREADS", "MXNET_ENGINE_TYPE",
    "MXNET_MKLDNN_ENABLED", "MXNET_SUBGRAPH_BACKEND", "MXNET_CPU_PRIORITY_NTHREADS",
    "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "TF_ENABLE_ONEDNN_OPTS",
    "XLA_FLAGS", "TORCHINDUCTOR_COMPILE_THREADS",
)
# Runners whose N devices are one MXNet CPU context (keras-mxnet maps every cpu(i) to cpu(0)).
ONE_CPU_CONTEXT = frozenset({"keras_mxnet"})
PER_RANK_LAUNCHERS = ("torchrun", "horovodrun")
SOURCES = {
    "mxnet": "MXNet perf.md: OMP_NUM_THREADS = physical cores (vCPUs / 2 on 2-way SMT), shared "
             "by the engine's per-context workers",
    "rank": "torchrun: OMP_NUM_THREADS per rank, the physical cores shared by the ranks",
}


def physical_cores() -> int:
    """The physical cores this process may run on: its CPU affinity over the hardware threads
    per core (Linux sysfs; 1 where it cannot be read)."""
    try:
        logical = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        logical = os.cpu_count() or 1
    per_core = 1
    with contextlib.suppress(OSError, ValueError), \
            open("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list") as fh:
        per_core = max(1, _count_cpu_list(fh.read()))
    return max(1, logical // per_core)


def _count_cpu_list(text: str) -> int:
    """How many CPUs a kernel CPU list ("0", "0,64", "0-3,8") names."""
    count = 0
    for part in text.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            count += int(hi) - int(lo) + 1
        elif part:
            count += 1
    return count


def busy_cpus(interval_s: float = 0.25) -> float | None:
    """Logical CPUs the whole host kept busy over `interval_s` (/proc/stat's non-idle share of
    its time x the CPUs it counts); None where /proc/stat cannot be read."""

    def sample() -> tuple[int, int, int]:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
        fields = [int(v) for v in lines[0].split()[1:]]
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0), cpus

    try:
        total0, idle0, cpus = sample()
        time.sleep(interval_s)
        total1, idle1, _ = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return round(cpus * (total - (idle1 - idle0)) / total, 2) if total > 0 else None


def free_cores(cores: int, busy: float | None) -> int:
    """The physical cores other processes left free (at least 1): `busy` logical CPUs over the
    host's hardware threads per core, rounded to whole cores."""
    if busy is None:
        return cores
    logical = os.cpu_count() or cores
    return max(1, min(cores, cores - round(busy / max(1, logical // cores))))


def thread_env(family: str, runner: str, launcher: str, device: str, num_devices: int,
               environ: Mapping[str, str], cores: int | None = None,
               busy: float | None = None) -> dict[str, str]:
    """The variables the policy adds to a child's environment (none the user already set),
    with POLICY_VAR saying what was set and why, for the record. `busy`: the logical CPUs
    other processes kept busy just before the launch (busy_cpus): the threads are sized to
    the cores they left free, and the note says what was seen."""
    if environ.get(POLICY_VAR, "").strip().lower() in OFF:
        return {}
    if environ.get(POLICY_VAR, "").strip().lower() == ALL_CORES:
        busy = None
    wanted: dict[str, str] = {}
    source = ""
    if device == "cpu":
        host = cores or physical_cores()
        cores = free_cores(host, busy)
        if family == "mxnet":
            contexts = 1 if runner in ONE_CPU_CONTEXT else max(1, num_devices)
            wanted["OMP_NUM_THREADS"] = str(max(1, cores // contexts))
            source = SOURCES["mxnet"]
        elif launcher in PER_RANK_LAUNCHERS:
            wanted["OMP_NUM_THREADS"] = str(max(1, cores // max(1, num_devices)))
            source = SOURCES["rank"]
    added = {k: v for k, v in wanted.items() if k not in environ}
    kept = sorted(k for k in wanted if k in environ)
    note = " ".join(f"{k}={v}" for k, v in added.items()) or "nothing set (framework defaults)"
    if source:
        note += f" ({source})"
        if busy is not None:
            note += (f"; at launch {busy:g} logical CPUs were busy: sized to {cores} of "
                     f"{host} cores")
    if kept:
        note += f"; the user's {', '.join(kept)} kept"
    return {**added, POLICY_VAR: note}


def side_file(result: str | Path, rank: int) -> Path:
    """Where a rank other than 0 writes its memory (beside the result rank 0 writes)."""
    return Path(f"{result}.memory.rank{rank}.json")
