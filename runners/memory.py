"""Memory per device over the timed window, and the model state a run holds (child side).

`window_start()`/`window_end()` (called by runners.common's timed loop) read the allocator peak
of whichever framework the process initialised (none imported here), or on CPU the process's
peak resident memory above its `baseline()`, read again by each family's device setup once its
framework's runtime is loaded (the same point in every framework); `for_result` gives the
record's fields.
`model_state_torch`, `model_state_jax`, `model_state_keras`: bytes of parameters, gradients and
optimizer state. Details: docs/runners/shared.md."""

from __future__ import annotations

import contextlib
import math
import re
import resource
import sys
from pathlib import Path
from typing import Any

from contract.reasons import code

CLEAR_REFS = Path("/proc/self/clear_refs")
STATUS = Path("/proc/self/status")
WORKERS_NOTE = "the process itself: DataLoader/Grain/loader workers are processes of their own"

# the family whose framework a run trains with (runners.common.main sets it from the spec);
# its allocator is read first when several frameworks are imported
_family: str | None = None
_start: dict[str, Any] | None = None
last: dict[str, Any] | None = None  # the latest window's reading: {"devices", "source", "cpu"}
_baseline: int | None = None  # VmRSS before the runner built its model (baseline())
_baseline_at: str | None = None  # where it was read: a reason code (memory.baseline_*)


def expect(family: str | None) -> None:
    """The run's framework family (torch, jax, tf, mxnet, keras): its allocator first."""
    global _family
    _family = family


# -- the frameworks' allocators --------------------------------------------------------------

# A start function gets the imported framework module and returns the devices to read at the
# end (None: none); window_start calls it only when the module is imported, an error is None.

def _torch_start(torch: Any) -> Any:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    devices = [i for i in range(torch.cuda.device_count())
               if torch.cuda.memory_allocated(i) > 0 or torch.cuda.max_memory_allocated(i) > 0]
    for i in devices:
        torch.cuda.reset_peak_memory_stats(i)
    return devices


def _torch_end(devices: Any) -> dict[str, int]:
    torch = sys.modules["torch"]
    return {str(torch.device("cuda", i)): int(torch.cuda.max_memory_allocated(i))
            for i in devices or ()}


def _jax_gpus(jax: Any) -> list[Any] | None:
    # never initialise a backend the run did not (it would take GPU memory)
    from jax._src import xla_bridge

    ready = getattr(xla_bridge, "backends_are_initialized", None)
    if ready is not None and not ready():
        return None
    return [d for d in jax.local_devices() if d.platform != "cpu"]


def _jax_end(devices: Any) -> dict[str, int]:
    stats = {str(d): d.memory_stats() or {} for d in devices or ()}
    return {d: int(s["peak_bytes_in_use"]) for d, s in stats.items() if "peak_bytes_in_use" in s}


def _tf_start(tf: Any) -> Any:
    from tensorflow.python.eager import context

    # only a runtime the run started (listing devices would start one)
    if getattr(context.context(), "_context_handle", None) is None:
        return None
    gpus = [d.name.split("device:")[-1] for d in tf.config.list_logical_devices("GPU")]
    for name in gpus:
        with contextlib.suppress(Exception):
            tf.config.experimental.reset_memory_stats(name)
    return gpus


def _tf_end(devices: Any) -> dict[str, int]:
    tf = sys.modules["tensorflow"]
    out = {}
    for name in devices or ():
        with contextlib.suppress(Exception):
            out[name] = int(tf.config.experimental.get_memory_info(name)["peak"])
    return out


def _mxnet_gpus(mx: Any) -> list[int] | None:
    n = mx.context.num_gpus()
    return list(range(n)) if n else None


def _mxnet_end(devices: Any) -> dict[str, int]:
    mx = sys.modules["mxnet"]
    free_total = {i: mx.context.gpu_memory_info(i) for i in devices or ()}
    return {f"gpu({i})": int(total - free) for i, (free, total) in free_total.items()}


# name: (family, devices at the start (reset there), the bytes at the end, what it is)
ALLOCATORS: dict[str, tuple[str, Any, Any, str]] = {
    "torch": ("torch", _torch_start, _torch_end, code("memory.torch_max_allocated")),
    "jax": ("jax", _jax_gpus, _jax_end, code("memory.jax_peak_bytes_in_use")),
    "tensorflow": ("tf", _tf_start, _tf_end, code("memory.tf_memory_info_peak")),
    "mxnet": ("mxnet", _mxnet_gpus, _mxnet_end, code("memory.mxnet_gpu_memory_info"))}


# -- the process's resident memory -----------------------------------------------------------

def _status_kb(field: str) -> int | None:
    """A /proc/self/status memory field (VmHWM, VmRSS) in bytes; None where unreadable."""
    try:
        m = re.search(rf"^{field}:\s+(\d+)\s*kB", STATUS.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) * 1024 if m else None


def baseline(at: str = code("memory.baseline_before_benchmark")) -> None:
    """Before the runner builds its model: the resident memory its CPU device peak is above,
    and `at`, the reason code of the point it was read. runners.common.main reads it before the
    runner's benchmark; each family's device setup reads it again, overwriting it, once its
    framework and runtime are loaded and its devices initialised."""
    global _baseline, _baseline_at
    _baseline, _baseline_at = _status_kb("VmRSS"), at


def _reset_hwm() -> bool:
    """Reset the process's peak resident memory to its current one (clear_refs 5)."""
    try:
        with open(CLEAR_REFS, "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _cpu_end(reset: bool) -> tuple[int | None, str]:
    hwm = _status_kb("VmHWM") if reset else None
    if hwm is not None:
        return hwm, code("memory.vmhwm_timed_window")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux
    why = "/proc/self/clear_refs is not writable" if not reset else "no VmHWM to read"
    return peak, (f"peak resident memory since the process started (getrusage ru_maxrss; {why}"
                  f", so not the window's alone) of {WORKERS_NOTE}")


# -- the window ------------------------------------------------------------------------------

def window_start() -> None:
    """Just before the timed window's clock starts: reset the peaks that can be reset."""
    global _start
    started: dict[str, Any] = {}
    for name in sorted(ALLOCATORS, key=lambda n: ALLOCATORS[n][0] != _family):
        if name in sys.modules:
            try:
                devices = ALLOCATORS[name][1](sys.modules[name])
            except Exception:
                devices = None
            if devices:
                started[name] = devices
    _start = {"allocators": started, "cpu_reset": False if started else _reset_hwm()}


def window_end() -> dict[str, Any] | None:
    """After the window's last clock reading: the peaks, kept in `last` and returned as
    {"devices": {framework's device name: bytes} or {}, "cpu": the process's bytes when no
    accelerator allocator was read, "source": what was read}."""
    global last, _start
    if _start is None:
        return None
    for name, devices in _start["allocators"].items():
        try:
            read = ALLOCATORS[name][2](devices)
        except Exception as exc:
            read, error = {}, f"{type(exc).__name__}: {exc}"
        else:
            error = None
        if read:
            last = {"devices": read, "cpu": None, "source": ALLOCATORS[name][3]}
            break
        if error:
            _start.setdefault("errors", []).append(f"{name}: {error}")
    else:
        cpu, source = _cpu_end(_start["cpu_reset"])
        if _start["allocators"]:
            source += (" (the accelerator allocators gave nothing: "
                       f"{'; '.join(_start.get('errors', [])) or 'no device read'})")
        last = {"devices": {}, "cpu": cpu, "source": source}
    _start = None
    return last


def for_result(spec: Any, rank: int) -> dict[str, Any]:
    """The result's memory_per_device, memory_source, device_peak_bytes and memory_baseline
    from the latest reading, keyed rank<r>:<device> for a process that drives one device,
    process<r>:<device> for one that drives several; on CPU the process's one figure."""
    if last is None:
        return {"memory_per_device": None,
                "memory_source": code("memory.no_timed_window"),
                "device_peak_bytes": None, "memory_baseline": None}
    one_per_process = spec.launcher in ("torchrun", "horovodrun")
    prefix = f"rank{rank}" if one_per_process else f"process{rank}"
    if last["devices"]:
        per_device = {f"{prefix}:{d}": b for d, b in last["devices"].items()}
        return {"memory_per_device": per_device, "memory_source": last["source"],
                "device_peak_bytes": dict(per_device), "memory_baseline": None}
    shared = 1 if one_per_process else spec.num_devices // max(1, spec.num_nodes)
    if shared > 1:
        key = f"{prefix}:cpu ({shared} virtual devices)"
        source = (f"{last['source']}; the {shared} virtual CPU devices share this one process, "
                  "so its figure is given once")
    else:
        key, source = f"{prefix}:cpu", last["source"]
    if getattr(spec, "device", "cpu") != "cpu":
        source += "; " + code("memory.no_gpu_allocator")
    peak: dict[str, int] | None = None
    if _baseline is not None and last["cpu"] is not None:
        peak = {key: max(0, last["cpu"] - _baseline) // shared}
        where = f"; {_baseline_at}" if _baseline_at else ""
        source += "; " + code("memory.device_peak_less_baseline") + where + (
            f"; divided by the {shared} virtual devices (each one's share)" if shared > 1 else "")
    return {"memory_per_device": {key: last["cpu"]}, "memory_source": source,
            "device_peak_bytes": peak,
            "memory_baseline": None if _baseline is None else {key: _baseline}}


# -- the model state -------------------------------------------------------------------------

def _itemsize(dtype: Any) -> int:
    size = getattr(dtype, "itemsize", None) or getattr(dtype, "size", None)
    if isinstance(size, int) and not isinstance(dtype, str):
        return size
    name = str(getattr(dtype, "name", dtype)).removeprefix("tf.").removeprefix("torch.")
    if name == "bfloat16":
        return 2
    import numpy as np

    return int(np.dtype(name).itemsize)


def _state(params: int, grads: int, optimizer: int, source: str) -> dict[str, Any]:
    return {"model_state": {"params_bytes": params, "grads_bytes": grads,
                            "optimizer_bytes": optimizer,
                            "total_bytes": params + grads + optimizer, "source": source}}


def model_state_torch(module: Any, optimizer: Any = None) -> dict[str, Any]:
    """{"model_state": ...} of a torch module and its optimizer, on this rank's device: the
    parameters and buffers, the .grad tensors it holds now, the optimizer's state tensors."""
    import torch

    def nbytes(t: Any) -> int:  # a DTensor (FSDP2's sharded tensors): this rank's shard
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()

    params = sum(nbytes(t) for t in module.parameters())
    params += sum(nbytes(t) for t in module.buffers())
    grads = sum(nbytes(p.grad) for p in module.parameters() if p.grad is not None)
    opt = 0
    for state in (optimizer.state.values() if optimizer is not None else ()):
        opt += sum(nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return _state(params, grads, opt, code("memory.torch_state"))


def model_state_jax(params: Any, opt_state: Any, model_state: Any = None) -> dict[str, Any]:
    """{"model_state": ...} of a params tree, an optax state and the model's other state
    (batch_stats, counted with the params): each array's nbytes (one copy of a replicated
    array); the gradients are the params' shapes, made inside the jitted step."""
    import jax

    def nbytes(tree: Any) -> int:
        return sum(int(getattr(x, "nbytes", 0)) for x in jax.tree_util.tree_leaves(tree))

    p = nbytes(params)
    return _state(p + nbytes(model_state), p, nbytes(opt_state), code("memory.jax_state"))


def model_state_keras(model: Any, optimizer: Any = None) -> dict[str, Any]:
    """{"model_state": ...} of a Keras model (model.weights) and its optimizer's variables
    (default model.optimizer); the gradients are the trainable weights' shapes."""
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)

    def nbytes(variables: Any) -> int:
        return sum(math.prod(int(d) for d in v.shape) * _itemsize(v.dtype) for v in variables)

    opt = nbytes(getattr(optimizer, "variables", None) or ()) if optimizer is not None else 0
    return _state(nbytes(model.weights), nbytes(model.trainable_weights), opt,
                  code("memory.keras_state"))

