"""The machine a sweep ran on: host, OS, CPU, memory, Python, GPUs (NVML), harness commit.

GPUs are read through NVML (nvidia-ml-py), never through a framework: listing GPUs from
TensorFlow initialises every one of them (seed 002, tip 5).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from typing import Any

from bench import REPO_ROOT


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# the vector units a CPU's matmul peak depends on (TF's oneDNN turns on with AVX-512): hosts
# whose model name is a generic "Intel(R) Xeon(R) Processor" differ here
ISA_FLAGS = (("amx_tile", "amx"), ("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx"))


def cpu_isa() -> str:
    """The CPU's vector extensions that set its peak, e.g. "amx+avx512+avx2+avx" ("unknown"
    where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh
                          if line.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is None:
        return "unknown"
    return "+".join(name for flag, name in ISA_FLAGS if flag in flags) or "none"


def memory_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gpus() -> list[dict[str, Any]]:
    """GPUs NVML sees: name, memory, driver and CUDA versions; [] without NVML or GPUs."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        found = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            found.append({
                "index": i,
                "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                "driver_version": driver,
                "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
                **interconnect(pynvml, handle),
            })
        return found
    except pynvml.NVMLError:
        return []
    finally:
        pynvml.nvmlShutdown()


NVLINK_MAX = 18  # links per GPU on NVLink 4 (H100); older GPUs answer "not supported" sooner


def interconnect(pynvml: Any, handle: Any) -> dict[str, Any]:
    """A GPU's PCIe link (generation and width, now and at most; a link idles at a lower
    generation) and its active NVLink count; None where NVML cannot say."""
    def read(name: str, *args: Any) -> Any:
        try:
            return getattr(pynvml, name)(handle, *args)
        except (pynvml.NVMLError, AttributeError):
            return None

    nvlinks = 0
    for link in range(NVLINK_MAX):
        state = read("nvmlDeviceGetNvLinkState", link)
        if state is None:
            break
        nvlinks += int(state == getattr(pynvml, "NVML_FEATURE_ENABLED", 1))
    return {
        "pcie_gen": read("nvmlDeviceGetCurrPcieLinkGeneration"),
        "pcie_width": read("nvmlDeviceGetCurrPcieLinkWidth"),
        "pcie_max_gen": read("nvmlDeviceGetMaxPcieLinkGeneration"),
        "pcie_max_width": read("nvmlDeviceGetMaxPcieLinkWidth"),
        "nvlinks_active": nvlinks,
    }


def gpu_topology() -> dict[str, Any]:
    """`nvidia-smi topo -m` (how each GPU pair connects: NVLink, PCIe switch, CPU socket) as
    text, or why it is missing."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"nvidia_smi_topo_m": None, "reason": "nvidia-smi is not on PATH"}
    try:
        done = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True,
                              errors="replace", timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"nvidia_smi_topo_m": None, "reason": f"nvidia-smi topo -m: {exc}"}
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()
        return {"nvidia_smi_topo_m": None,
                "reason": f"nvidia-smi topo -m exited {done.returncode}: "
                          f"{why[0] if why else 'no output'}"}
    return {"nvidia_smi_topo_m": done.stdout.rstrip(), "reason": None}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def git_commit() -> str | None:
    """The harness's commit, with '-dirty' when the work tree has changes."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, errors="replace", timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, errors="replace",
                               timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) if sha else None


def lock_for(family: str, variant: str, python: str | None = None) -> dict[str, Any] | None:
    """The lock a run's environment was installed from (bench/run/envs.py): its file, sha256,
    whether it was a lock at all, and the installer that built the environment; None for a
    run in a user's own interpreter (runner_options.<runner>.python) or the harness's."""
    from bench.run.envs import EnvError, family_env

    if python:
        return None
    try:
        return family_env(family, variant).lock_record()
    except (EnvError, KeyError, OSError):
        return None


def capture() -> dict[str, Any]:
    """A snapshot of the host, taken once per sweep by the parent."""
    return {
        "host": platform.node(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_cores": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "python": platform.python_version(),
        "parent_python": sys.executable,
        "gpus": gpus(),
        "gpu_topology": gpu_topology(),
        "harness_commit": git_commit(),
    }
