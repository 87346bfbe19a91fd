"""The parent's telemetry sampler: while a run goes, read its GPUs through NVML and the host and
the run's process tree through psutil at a fixed interval; afterwards cut the samples to the
timed window the child reported, write them as a CSV time series and summarise them.

No framework is imported: NVML (nvidia-ml-py) reads the driver directly, as environment.py
does, so sampling never initialises a GPU (seed 002, tip 5).
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.atomic import atomic_file

HOST_FIELDS = ("host_cpu_pct", "host_mem_used_bytes", "run_cpu_cores", "run_rss_bytes",
               "other_cpu_cores", "run_top_thread_cores")
# HOST-BOUND: the GPUs below starved_below_pct while the run's busiest thread (a rank's Python
# loop launching kernels) kept this much of one core through the timed window: the host's own
# per-step work sets the pace, not input or synchronisation (STARVED).
HOST_BOUND_CORES = 0.9
# CONTENDED: processes outside the run (and outside this harness) used more than this share of
# the machine's logical CPUs on average over the timed window, or any other process held one of
# the run's GPUs. A quarter: on 2 cores half a core, which is what an orphaned CPU run or a
# compile beside the benchmark costs; an idle desktop stays well under it.
CONTENDED_CPU_SHARE = 0.25
TOP_OTHERS = 3
GPU_FIELDS = ("util_pct", "mem_util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz",
              "temp_c", "pcie_tx_kbs", "pcie_rx_kbs")
# A GPU below this share of utilisation in a sample counts as idle (a pause between bursts).
IDLE_UTIL_PCT = 10.0
# NVML's PCIe counters block for ~20 ms each, so they are read about once a second.
PCIE_EVERY_S = 1.0


def open_nvml() -> tuple[Any | None, str | None]:
    """(pynvml initialised, None), or (None, why there is no NVML here)."""
    try:
        import pynvml
    except ImportError:
        return None, "no NVML: nvidia-ml-py is not installed in the harness's interpreter"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"no NVML: {exc}"
    return pynvml, None


class ProcessTree:
    """CPU seconds and resident memory of a process and all its descendants. A descendant
    that has exited keeps its last reading, so a short-lived worker still counts."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self._cpu: dict[tuple[int, float], float] = {}
        self.pids: set[int] = {pid}
        self.threads: dict[tuple[int, int], float] = {}

    def read(self) -> tuple[float, int]:
        """(CPU seconds so far, RSS bytes now) of the tree; each live thread's CPU seconds so
        far in `threads`."""
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            procs = []
        self.pids = {p.pid for p in procs}
        rss, threads = 0, {}
        for proc in procs:
            with contextlib.suppress(psutil.Error), proc.oneshot():
                times = proc.cpu_times()
                self._cpu[(proc.pid, proc.create_time())] = times.user + times.system
                rss += proc.memory_info().rss
                threads.update({(proc.pid, th.id): th.user_time + th.system_time
                                for th in proc.threads()})
        self.threads = threads
        return sum(self._cpu.values()), rss


def busiest_thread(before: dict[tuple[int, int], float], after: dict[tuple[int, int], float],
                   seconds: float) -> float | None:
    """The most CPU cores one thread used between two readings (None with no common thread)."""
    used = [after[k] - before[k] for k in after.keys() & before.keys()]
    return max(0.0, max(used) / seconds) if used and seconds > 0 else None


def _cpu_by_process() -> dict[tuple[int, float], tuple[str, float]]:
    """(pid, start time) -> (name, CPU seconds so far) of every process we may read."""
    found = {}
    for proc in psutil.process_iter(["name", "cpu_times", "create_time"]):
        info = proc.info
        if info.get("cpu_times") is None or info.get("create_time") is None:
            continue
        found[(proc.pid, info["create_time"])] = (
            info.get("name") or "?", info["cpu_times"].user + info["cpu_times"].system)
    return found


class OtherProcesses:
    """Which processes outside the run's tree (and this harness) used the CPU during the run,
    and which held the run's GPUs: the evidence behind CONTENDED."""

    def __init__(self, tree: ProcessTree) -> None:
        self.tree = tree
        self.mine = {os.getpid()}
        self.start = _cpu_by_process()
        self.t0 = time.time()
        self.gpu_holders: dict[tuple[int, int], dict[str, Any]] = {}

    def note_gpu(self, index: int, procs: Sequence[Any]) -> None:
        for p in procs:
            if p.pid in self.tree.pids or p.pid in self.mine:
                continue
            try:
                name = psutil.Process(p.pid).name()
            except psutil.Error:
                name = "?"  # another container's process: NVML sees it, psutil may not
            used = getattr(p, "usedGpuMemory", None)
            self.gpu_holders[(index, p.pid)] = {"gpu": index, "pid": p.pid, "name": name,
                                                "gpu_mem_bytes": used}

    def top(self) -> list[dict[str, Any]]:
        """The biggest CPU users outside the run since the sampler started."""
        elapsed = max(time.time() - self.t0, 1e-9)
        end = _cpu_by_process()
        used = []
        for key, (name, cpu) in end.items():
            if key[0] in self.tree.pids or key[0] in self.mine:
                continue
            before = self.start.get(key, (name, 0.0))[1]
            if cpu - before > 0:
                used.append({"pid": key[0], "name": name, "cpu_s": round(cpu - before, 3),
                             "cores": round((cpu - before) / elapsed, 3)})
        return sorted(used, key=lambda u: -u["cpu_s"])[:TOP_OTHERS]


@dataclass(frozen=True)
class Sampling:
    """How samples were taken: every interval_s, why NVML was not read (None: it was),
    whether any GPU was sampled, the host's logical CPUs, and the other processes seen (the
    most CPU time; those holding a sampled GPU)."""

    interval_s: float
    nvml_reason: str | None = None
    sampled_gpus: bool = True
    logical_cpus: int | None = None
    top_others: Sequence[dict[str, Any]] = ()
    gpu_holders: Sequence[dict[str, Any]] = ()


class Sampler:
    """A background thread that samples every interval_s until stop()."""

    def __init__(self, pid: int, gpu_indices: Sequence[int], interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, Any]] = []
        self.tree = ProcessTree(pid)
        self.nvml, self.nvml_reason = open_nvml()
        self.handles: list[tuple[int, Any]] = []
        if self.nvml is not None:
            for i in gpu_indices:
                try:
                    self.handles.append((i, self.nvml.nvmlDeviceGetHandleByIndex(i)))
                except self.nvml.NVMLError as exc:
                    self.nvml_reason = f"GPU {i}: {exc}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="telemetry", daemon=True)
        self._last_pcie = -math.inf
        self._prev: tuple[float, float] | None = None
        self.logical_cpus = psutil.cpu_count() or 1
        self.others = OtherProcesses(self.tree)
        self.top_others: list[dict[str, Any]] = []
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        """Stop sampling (one last sample first) and release NVML; returns the samples."""
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):
            self.top_others = self.others.top()
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
        return self.samples

    def sampling(self) -> Sampling:
        """How this sampler sampled (after stop(): with the other processes it saw)."""
        return Sampling(self.interval_s, self.nvml_reason, bool(self.handles),
                        self.logical_cpus, self.top_others,
                        list(self.others.gpu_holders.values()))

    def _loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):  # a failed reading must never end the run
                self.samples.append(self.sample())
            if self._stop.wait(self.interval_s):
                with contextlib.suppress(Exception):
                    self.samples.append(self.sample())
                return

    def sample(self) -> dict[str, Any]:
        """One reading of the host, the run's process tree and each GPU."""
        t = time.time()
        before = self.tree.threads
        cpu_s, rss = self.tree.read()
        cores = top_thread = None
        if self._prev is not None and t > self._prev[0]:
            cores = max(0.0, (cpu_s - self._prev[1]) / (t - self._prev[0]))
            top_thread = busiest_thread(before, self.tree.threads, t - self._prev[0])
        self._prev = (t, cpu_s)
        host_pct = psutil.cpu_percent(interval=None)
        row: dict[str, Any] = {
            "t": t, "host_cpu_pct": host_pct,
            "host_mem_used_bytes": psutil.virtual_memory().used,
            "run_cpu_cores": cores, "run_rss_bytes": rss,
            # the host's busy cores less the run's: the harness's own share is in it (small)
            "other_cpu_cores": (max(0.0, host_pct / 100 * self.logical_cpus - cores)
                                if cores is not None else None),
            "run_top_thread_cores": top_thread,
        }
        pcie = t - self._last_pcie >= PCIE_EVERY_S
        if pcie:
            self._last_pcie = t
        for i, handle in self.handles:
            row.update({f"gpu{i}_{k}": v for k, v in self._gpu(handle, pcie).items()})
            if pcie:  # who else holds this GPU, at the PCIe readings' pace
                with contextlib.suppress(Exception):
                    nv = self.nvml
                    assert nv is not None
                    self.others.note_gpu(i, [*nv.nvmlDeviceGetComputeRunningProcesses(handle),
                                             *nv.nvmlDeviceGetGraphicsRunningProcesses(handle)])
        return row

    def _gpu(self, handle: Any, pcie: bool) -> dict[str, Any]:
        nv = self.nvml
        assert nv is not None

        def read(fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except nv.NVMLError:
                return None

        util = read(lambda: nv.nvmlDeviceGetUtilizationRates(handle))
        mem = read(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
        power_mw = read(lambda: nv.nvmlDeviceGetPowerUsage(handle))
        return {
            "util_pct": util.gpu if util else None,
            "mem_util_pct": util.memory if util else None,
            "mem_used_bytes": int(mem.used) if mem else None,
            "power_w": power_mw / 1000 if power_mw is not None else None,
            "sm_clock_mhz": read(lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM)),
            "temp_c": read(lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU)),
            "pcie_tx_kbs": read(lambda: nv.nvmlDeviceGetPcieThroughput(
                handle, nv.NVML_PCIE_UTIL_TX_BYTES)) if pcie else None,
            "pcie_rx_kbs": read(lambda: nv.nvmlDeviceGetPcieThroughput(
                handle, nv.NVML_PCIE_UTIL_RX_BYTES)) if pcie else None,
        }


def in_window(samples: Sequence[dict[str, Any]], start: float | None,
              end: float | None) -> list[bool]:
    """Which samples belong to the timed window: a sample describes the time since the one
    before it, so it belongs when the middle of that span lies inside [start, end]."""
    if start is None or end is None:
        return [False] * len(samples)
    flags, prev = [], None
    for s in samples:
        mid = s["t"] if prev is None else (prev + s["t"]) / 2
        flags.append(start <= mid <= end)
        prev = s["t"]
    return flags


def gpu_indices_of(samples: Sequence[dict[str, Any]]) -> list[int]:
    """The GPUs a series holds columns for, in order."""
    found = set()
    for s in samples:
        for key in s:
            index = key[3:].split("_", 1)[0]
            if key.startswith("gpu") and key.endswith("_util_pct") and index.isdigit():
                found.add(int(index))
    return sorted(found)


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def _max(values: list[Any]) -> Any:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def contention(inside: Sequence[dict[str, Any]], logical_cpus: int,
               top_others: Sequence[dict[str, Any]], gpu_holders: Sequence[dict[str, Any]]
               ) -> dict[str, Any]:
    """How much of the machine others took during the timed window, who, and the verdict."""
    other = _mean([s.get("other_cpu_cores") for s in inside])
    share = other / logical_cpus if other is not None else None
    reasons = []
    if share is not None and share > CONTENDED_CPU_SHARE:
        names = ", ".join(f"{o['name']} (pid {o['pid']}, {o['cores']:.2f} cores)"
                          for o in top_others) or "not identified"
        reasons.append(f"other processes used {other:.2f} of {logical_cpus} CPUs in the timed "
                       f"window (over {CONTENDED_CPU_SHARE:.0%}); biggest: {names}")
    for h in gpu_holders:
        reasons.append(f"GPU {h['gpu']} also held by {h['name']} (pid {h['pid']})")
    return {"other_cpu_cores_mean": other, "other_cpu_share": share,
            "logical_cpus": logical_cpus, "threshold_share": CONTENDED_CPU_SHARE,
            "top_other_processes": list(top_others), "gpu_other_processes": list(gpu_holders),
            "contended": bool(reasons) if (share is not None or gpu_holders) else None,
            "reason": "; ".join(reasons) or None}


def summarise(samples: Sequence[dict[str, Any]], window_start: float | None,
              window_end: float | None, images: int | None, *, starved_below_pct: float,
              sampling: Sampling) -> dict[str, Any]:
    """The record's telemetry: means over the timed window (peaks over the whole run), energy
    and joules per image from the power samples, and the starved flag."""
    flags = in_window(samples, window_start, window_end)
    inside = [s for s, f in zip(samples, flags, strict=True) if f]
    window_s = (window_end - window_start) if window_start is not None and window_end else None
    interval_s = sampling.interval_s
    out: dict[str, Any] = {
        "interval_s": interval_s, "samples": len(samples), "samples_in_window": len(inside),
        "window_s": window_s,
        "nvml": {"available": sampling.nvml_reason is None, "reason": sampling.nvml_reason},
        "note": None,
    }
    if not inside:
        out["note"] = ("no timed window reported" if window_s is None else
                       f"no sample fell in the {window_s:.3g} s timed window "
                       f"(sampling every {interval_s:g} s)")
    out["host"] = {
        "cpu_util_mean_pct": _mean([s["host_cpu_pct"] for s in inside]),
        "cpu_util_max_pct": _max([s["host_cpu_pct"] for s in inside]),
        "mem_used_max_bytes": _max([s["host_mem_used_bytes"] for s in samples]),
        "run_cpu_cores_mean": _mean([s["run_cpu_cores"] for s in inside]),
        "run_rss_max_bytes": _max([s["run_rss_bytes"] for s in samples]),
        "top_thread_cores_mean": _mean([s.get("run_top_thread_cores") for s in inside]),
    }
    gpus = [_gpu_summary(i, samples, inside, window_s) for i in gpu_indices_of(samples)]
    out["gpus"] = gpus
    utils = [g["util_mean_pct"] for g in gpus if g["util_mean_pct"] is not None]
    energies = [g["energy_j"] for g in gpus]
    out["gpu_util_mean_pct"] = statistics.fmean(utils) if utils else None
    out["energy_j"] = sum(energies) if gpus and all(e is not None for e in energies) else None
    out["joules_per_image"] = (out["energy_j"] / images
                               if out["energy_j"] is not None and images else None)
    out.update(idle_gpus(out["gpu_util_mean_pct"], out["host"]["top_thread_cores_mean"],
                         starved_below_pct))
    out["contention"] = contention(inside, sampling.logical_cpus or psutil.cpu_count() or 1,
                                   sampling.top_others, sampling.gpu_holders)
    if not sampling.sampled_gpus and out["note"] is None:
        out["note"] = "CPU run: no GPU sampled"
    return out


def idle_gpus(util_pct: float | None, top_thread_cores: float | None,
              starved_below_pct: float) -> dict[str, Any]:
    """Why the GPUs sat below starved_below_pct, if they did: host_bound when the busiest
    thread kept HOST_BOUND_CORES of a core (per-step launch work), else starved (input or
    synchronisation); None where no GPU was read."""
    out = {"starved_below_pct": starved_below_pct, "host_bound_cores": HOST_BOUND_CORES,
           "starved": None, "host_bound": None}
    if util_pct is not None:
        idle = util_pct < starved_below_pct
        busy = top_thread_cores is not None and top_thread_cores >= HOST_BOUND_CORES
        out.update(starved=idle and not busy, host_bound=idle and busy)
    return out


def _gpu_summary(i: int, samples: Sequence[dict[str, Any]], inside: list[dict[str, Any]],
                 window_s: float | None) -> dict[str, Any]:
    """GPU i's figures: means over the window's samples `inside`, peaks over all samples."""
    def col(k: str, rows: Sequence[dict[str, Any]]) -> list[Any]:
        return [s.get(f"gpu{i}_{k}") for s in rows]

    util = [u for u in col("util_pct", inside) if u is not None]
    power = _mean(col("power_w", inside))
    return {
        "index": i,
        "util_mean_pct": _mean(util), "util_min_pct": min(util) if util else None,
        "idle_share": (sum(u < IDLE_UTIL_PCT for u in util) / len(util)) if util else None,
        "mem_util_mean_pct": _mean(col("mem_util_pct", inside)),
        "mem_used_mean_bytes": _mean(col("mem_used_bytes", inside)),
        "mem_used_peak_bytes": _max(col("mem_used_bytes", samples)),
        "power_mean_w": power,
        "energy_j": power * window_s if power is not None and window_s else None,
        "sm_clock_mean_mhz": _mean(col("sm_clock_mhz", inside)),
        "temp_max_c": _max(col("temp_c", inside)),
        "pcie_tx_mean_kbs": _mean(col("pcie_tx_kbs", inside)),
        "pcie_rx_mean_kbs": _mean(col("pcie_rx_kbs", inside)),
    }


def write_series(path: Path, samples: Sequence[dict[str, Any]],
                 window_start: float | None, window_end: float | None) -> None:
    """The samples as CSV: t (unix seconds), t_rel (from the window's start, else the first
    sample), in_window (0/1), the host columns, then gpu<i>_<field> per GPU."""
    flags = in_window(samples, window_start, window_end)
    origin = window_start if window_start is not None else (samples[0]["t"] if samples else 0)
    gpu_cols = [f"gpu{i}_{k}" for i in gpu_indices_of(samples) for k in GPU_FIELDS]
    with atomic_file(path, newline="") as fh:  # whole or not at all; no temporary left
        w = csv.writer(fh)
        w.writerow(["t", "t_rel", "in_window", *HOST_FIELDS, *gpu_cols])
        for s, f in zip(samples, flags, strict=True):
            w.writerow([f"{s['t']:.3f}", f"{s['t'] - origin:.3f}", int(f),
                        *(_cell(s.get(k)) for k in (*HOST_FIELDS, *gpu_cols))])


def _cell(v: Any) -> str:
    if v is None:
        return ""
    return f"{v:.4g}" if isinstance(v, float) else str(v)
