"""What a DeepSpeed rank holds beside its model state (the record's `deepspeed_memory`): ZeRO's
buffers read back from its optimizer (tensors' bytes allocated, and on Linux their pages in
memory, from the page table), and the peak less state and buffers (the unexplained rest).
Imports no framework: tensors are read through numel(), element_size() and data_ptr().
docs/runners/deepspeed.md, Memory beyond the state."""

from __future__ import annotations

import resource
from array import array
from pathlib import Path
from typing import Any

from contract.reasons import code

SMAPS = Path("/proc/self/smaps")
PAGEMAP = Path("/proc/self/pagemap")
STATUS = Path("/proc/self/status")
SOURCE = code("torch.zero_memory_beyond_state")


def nbytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def resident_bytes(address: int, size: int, pagemap: Path = PAGEMAP) -> int | None:
    """The bytes of [address, address + size) whose pages are in memory or swapped, from the
    kernel's page table (/proc/self/pagemap: bit 63 present, 62 swapped), a page at either end
    counted by its bytes inside the range; None where it cannot be read (not Linux). Untouched
    pages of a large allocation are not counted."""
    page = resource.getpagesize()
    first, last = address // page, (address + max(size, 1) - 1) // page
    try:
        with pagemap.open("rb") as f:
            f.seek(first * 8)
            entries = array("Q", f.read((last - first + 1) * 8))
    except (OSError, ValueError):
        return None
    end = address + size
    return sum(min(end, (first + i + 1) * page) - max(address, (first + i) * page)
               for i, e in enumerate(entries) if e >> 62)  # a page's bytes inside the range


def shm_resident(smaps: Path = SMAPS) -> int | None:
    """The resident bytes (smaps Rss) of the process's shared-memory mappings under /dev/shm
    (DeepSpeed's shm_comm op's workspace, where it made one); None where smaps cannot be read."""
    try:
        lines = smaps.read_text().splitlines()
    except OSError:
        return None
    total, inside = 0, False
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            inside = len(fields) > 5 and fields[5].startswith("/dev/shm/")
        elif inside and fields and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def buffer_entry(tensors: list[Any], in_state: int = 0) -> dict[str, Any]:
    """One kind of buffer: bytes allocated, resident (its pages in memory; None where the page
    table cannot be read) and the bytes of it the state already counts (gradients in it)."""
    resident = [resident_bytes(int(t.data_ptr()), nbytes(t)) if t.is_cpu else None
                for t in tensors]
    return {"allocated_bytes": sum(nbytes(t) for t in tensors),
            "resident_bytes": sum(r for r in resident if r is not None)
            if tensors and None not in resident else None,
            "counted_in_state_bytes": in_state}


def zero_buffers(opt: Any, stage: int, params: list[Any], buckets: dict[str, Any] | None
                 ) -> dict[str, Any]:
    """ZeRO's buffers beside the state, from its optimizer: the gradient buckets (ipg_buckets;
    stage 1/2: `buckets`, their buffer_entry read as the reduction began, since ZeRO frees them
    after it; stage 3: its one buffer a dtype, kept), stage 1/2's flat parameter buffers' padding
    (bit16_groups_flat beyond the parameters), stage 3's persistent parameters (ds_persist: held
    whole on every rank beside their partition)."""
    if buckets is None:
        kept = [b.buffer for b in getattr(opt, "ipg_buckets", {}).values()]
        buckets = buffer_entry([b for b in kept if b is not None and not isinstance(b, list)])
    out = {"ipg_buckets": buckets}
    if stage < 3:
        flat = sum(nbytes(f) for f in opt.bit16_groups_flat)
        used = sum(nbytes(p) for group in opt.bit16_groups for p in group)
        out["flat_padding"] = {"allocated_bytes": flat - used, "resident_bytes": None,
                               "counted_in_state_bytes": 0}
    else:
        whole = [p for p in params if getattr(p, "ds_persist", False)]
        out["persistent_params"] = {"allocated_bytes": sum(nbytes(p.data) for p in whole),
                                    "resident_bytes": None, "counted_in_state_bytes": 0,
                                    "count": len(whole)}
    return out


def vmrss(status: Path = STATUS) -> int | None:
    """The process's resident memory now (VmRSS), bytes; None where it cannot be read."""
    try:
        line = next(ln for ln in status.read_text().splitlines() if ln.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def breakdown(peak: int | None, state: dict[str, int], buffers: dict[str, Any],
              held_after: int | None = None) -> dict[str, Any]:
    """A rank's peak split: its state (params + grads + optimizer), the buffers beside it (each
    buffer's resident bytes where known, else its allocated bytes, less what the state counts
    of it) and the rest, unexplained (peak less both; None without a peak). `held_after`: what
    the device holds after the step, measured as the peak is; the peak less it is what only
    lived within a step (transient_bytes)."""
    beside = sum(max(0, (b["resident_bytes"] if b["resident_bytes"] is not None
                         else b["allocated_bytes"]) - b["counted_in_state_bytes"])
                 for b in buffers.values())
    held = sum(state.values())
    return {"peak_bytes": peak, "state_bytes": held, "buffers": buffers,
            "buffers_bytes": beside,
            "unexplained_bytes": None if peak is None else peak - held - beside,
            "held_after_step_bytes": held_after,
            "transient_bytes": None if peak is None or held_after is None
            else peak - held_after}
