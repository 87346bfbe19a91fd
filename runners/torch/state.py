"""What each torch rank holds of the model state (`state_bytes`: parameters, .grad, optimizer
state, DTensor shards as their local shard) and the precision a run trained in
(`torch_precision`), both read back from the framework's objects. Imports torch."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from contract.precision_policy import resolve
from contract.reasons import code
from runners.common import Invalid
from runners.torch.dist import DeviceRank, PlacementTracker, StepParts

PARTS = ("params", "grads", "optimizer")
AFTER_WINDOW = code("torch.read_after_window")


def rank_state(params: Iterable[torch.Tensor], optimizer_states: Iterable[dict[str, Any]]
               ) -> dict[str, tuple[int, int]]:
    """This rank's (held, logical) bytes of the parameters, of the gradients they hold now and
    of the optimizer state tensors in `optimizer_states` (one state dict per parameter): a
    DTensor's local shard (to_local()) against its global shape; a plain tensor is whole
    where it is."""
    sums = {part: [0, 0] for part in PARTS}

    def add(part: str, t: torch.Tensor) -> None:
        held = t.to_local() if isinstance(t, DTensor) else t
        sums[part][0] += held.numel() * t.element_size()
        sums[part][1] += t.numel() * t.element_size()

    for p in params:
        add("params", p)
        if p.grad is not None:
            add("grads", p.grad)
    for state in optimizer_states:
        for v in state.values():
            if isinstance(v, torch.Tensor):
                add("optimizer", v)
    return {part: (held, whole) for part, (held, whole) in sums.items()}


def state_bytes(ranks: DeviceRank, params: Iterable[torch.Tensor],
                optimizer_states: Iterable[dict[str, Any]], when: str,
                partitioned: tuple[str, ...] = ()) -> dict[str, Any]:
    """The record's state_bytes_per_device / state_bytes_global / state_source (every rank
    calls it; rank 0 writes it). `when`: when it was read (state_source says it); `partitioned`:
    the parts each rank holds a disjoint share of in plain tensors, whose global size is the
    sum over the ranks. Invalid when the ranks disagree on a part's global size."""
    params = list(params)
    mine = rank_state(params, optimizer_states)
    rows = ranks.gather({"rank": ranks.rank, "device": str(ranks.device), **mine})
    per_device = {f"rank{row['rank']}:{row['device']}": {part: int(row[part][0])
                                                          for part in PARTS} for row in rows}
    whole: dict[str, int] = {}
    for part in PARTS:
        if part in partitioned:
            whole[part] = sum(int(row[part][0]) for row in rows)
            continue
        stated = {int(row[part][1]) for row in rows}
        if len(stated) != 1:
            raise Invalid(f"state_bytes_global: the ranks' {part} state global sizes "
                          f"{sorted(stated)} differ")
        whole[part] = stated.pop()
    how = ("DTensor.to_local() shards against the DTensor's global shape" if any(
        isinstance(p, DTensor) for p in params) else "whole tensors on each rank")
    source = (f"each rank's module.parameters(), their .grad and its optimizer's state tensors "
              f"({how}), gathered with the ranks' all_gather_object; buffers (running "
              f"statistics) not counted; {when}")
    if partitioned:
        source += (f"; {', '.join(partitioned)}: each rank's partition, the global size their "
                   "sum")
    return {"state_bytes_per_device": per_device, "state_bytes_global": whole,
            "state_source": source}


def dtype_of(tensors: Iterable[torch.Tensor], what: str) -> torch.dtype:
    """The one floating dtype `tensors` are in (Invalid if several)."""
    dtypes = {t.dtype for t in tensors if t.is_floating_point()}
    if len(dtypes) != 1:
        raise Invalid(f"{what} are in {sorted(map(str, dtypes))}, not one dtype")
    return dtypes.pop()


def compute_dtype(precision: str, computed: Any) -> str:
    """The dtype the forward computed in: the logits' dtype the step's PlacementTracker saw,
    or a dtype the framework states (a Keras policy's compute_dtype); float32 under precision
    tf32 is TF32 math where torch says TF32 matmuls are allowed."""
    if isinstance(computed, PlacementTracker):
        if len(computed.output_dtypes) != 1:
            raise Invalid(f"the forward gave logits in "
                          f"{sorted(map(str, computed.output_dtypes))}, not one dtype")
        computed = next(iter(computed.output_dtypes))
    name = str(computed).removeprefix("torch.")
    if precision == "tf32" and name == "float32" and torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return name


def torch_precision(precision: str, compute: Any, module: nn.Module,
                    reduce: Any, how: str, scaler: Any = None) -> dict[str, Any]:
    """The record's precision_policy: compute dtype (from the tracker's logits, or as the framework
    states it), the parameters' dtype read from `module` (torch's master weights), `reduce` as the
    runner read it back, the knobs (`how`), dynamic loss scaling where there is a `scaler`."""
    return {"precision_policy": resolve(
        precision, how=how, compute=compute_dtype(precision, compute),
        params=dtype_of(module.parameters(), "the parameters"), master=None, reduce=reduce,
        loss_scaling="dynamic" if scaler is not None else None)}


def autocast_precision(precision: str, ranks: DeviceRank, parts: StepParts, net: nn.Module
                       ) -> dict[str, Any]:
    """torch_precision of a torch.autocast run (torch_ddp, torch_zero1): the logits' dtype
    `parts` tracked, the gradients' dtype, the knobs as used."""
    if precision in ("fp32", "tf32"):
        how = "no autocast: float32 parameters and compute" + (
            " (TF32 matmuls and convolutions: torch.backends.cuda.matmul/cudnn.allow_tf32)"
            if precision == "tf32" else "")
    else:
        dtype = "bfloat16" if precision == "bf16" else "float16"
        how = f"torch.autocast({ranks.device.type}, {dtype})" + (
            " + torch.amp.GradScaler (dynamic loss scaling)" if parts.scaler is not None else "")
    return torch_precision(precision, parts.tracker, net, grad_dtype(net), how, parts.scaler)


def grad_dtype(module: nn.Module) -> torch.dtype:
    """The dtype of the gradients the module's parameters hold (what DDP's and Horovod's
    all-reduce sums: their buckets are in the gradients' dtype)."""
    return dtype_of((p.grad for p in module.parameters() if p.grad is not None),
                    "the gradients")
