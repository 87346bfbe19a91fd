"""torch_zero1: ZeRO stage 1 in native PyTorch, DDP with ZeroRedundancyOptimizer partitioning the
optimizer state, one process per device (torchrun), as PyTorch 2.13's tutorial does it. Differs:
the harness's models, SGD momentum 0.9 in place of Adam, synthetic data made on each device
once, no overlap_with_ddp. docs/runners/torch_zero1.md."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from contract.reasons import code
from runners.common import Invalid, Spec, main
from runners.memory import model_state_torch
from runners.torch import dist as td
from runners.torch.equivalence import probe_equivalence
from runners.torch.state import AFTER_WINDOW, autocast_precision, state_bytes

STRATEGY = code("torch.zero1_strategy")


def training_step(spec: Spec, ranks: td.Ranks, net: nn.Module, feed: td.Feed, lr: float,
                  momentum: float) -> tuple[td.Step, td.StepParts, ZeroRedundancyOptimizer]:
    """The one step function of both modes: `net` in DDP (its defaults, as the tutorial),
    ZeroRedundancyOptimizer over torch.optim.SGD(lr, momentum), the run's autocast (and a
    GradScaler in fp16), the batch from `feed` (dist.sgd_step)."""
    ddp = td.wrap_ddp(net, ranks)
    zero = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=lr,
                                   momentum=momentum)
    scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
    parts = td.StepParts(ddp, td.StepCounter(zero), td.PlacementTracker(net), scaler)
    ddp.train()
    return td.sgd_step(ranks, spec.precision, parts, feed), parts, zero


def partition_record(zero: ZeroRedundancyOptimizer, ranks: td.Ranks) -> dict[str, Any]:
    """Each rank's share of the parameters as ZeroRedundancyOptimizer partitioned them (the
    same table on every rank), after checking that this rank's local optimizer holds exactly
    its share's parameters and state for none other."""
    partition = zero._partition_parameters()
    if len(partition) != ranks.world:
        raise Invalid(f"ZeroRedundancyOptimizer partitioned over {len(partition)} ranks, the "
                      f"process group has {ranks.world}")
    mine = {id(p) for group in partition[ranks.rank] for p in group["params"]}
    local = {id(p) for group in zero.optim.param_groups for p in group["params"]}
    stray = {id(p) for p in zero.optim.state} - mine
    if local != mine or stray:
        raise Invalid(f"rank {ranks.rank}: ZeroRedundancyOptimizer's local optimizer steps "
                      f"{len(local)} parameters, its partition assigns {len(mine)}, and it "
                      f"holds state for {len(stray)} outside it")
    rows = [{"rank": r, "params": sum(len(g["params"]) for g in groups),
             "elements": sum(p.numel() for g in groups for p in g["params"])}
            for r, groups in enumerate(partition)]
    largest = max((p.numel() for groups in partition for g in groups for p in g["params"]),
                  default=0)
    return {"optimizer_partition": {
        "ranks": rows, "granularity": "whole parameters",
        "largest_parameter_elements": largest,
        "source": code("torch.zero1_partition_source")}}


def granular(state: dict[str, Any], zero: ZeroRedundancyOptimizer) -> dict[str, Any]:
    """`state` with `state_granularity_bytes`: the partition assigns whole parameters, so a
    rank's optimizer share can exceed 1/N by up to the largest parameter's state (its
    elements x the optimizer's state bytes per element, from the global figures); the
    parent's split check allows that much (bench/records/state_check.py)."""
    sizes = [p.numel() for groups in zero._partition_parameters() for g in groups
             for p in g["params"]]
    elements, largest = sum(sizes), max(sizes, default=0)
    per_element = state["state_bytes_global"]["optimizer"] / elements if elements else 0
    return {**state, "state_granularity_bytes": {"optimizer": int(largest * per_element)}}


def benchmark(spec: Spec) -> dict[str, Any]:
    ranks = td.init_ranks(spec, spec.options["backend"], check=True)
    model_spec, feed, net = td.rank_model(spec, ranks)
    step, parts, zero = training_step(spec, ranks, net, feed, 0.01, 0.9)
    result = td.timed_steps(spec, ranks, step, parts.counter, parts.tracker, feed)
    return td.closing(ranks, result, td.nchw_fields(STRATEGY), {
        "optimizer": {"class": "torch.distributed.optim.ZeroRedundancyOptimizer",
                      "optimizer_class": type(zero.optim).__name__},
    }, partition_record(zero, ranks),
        granular(state_bytes(ranks, net.parameters(), zero.optim.state.values(), AFTER_WINDOW,
                             partitioned=("optimizer",)), zero),
        autocast_precision(spec.precision, ranks, parts, net),
        td.model_record(net, model_spec), model_state_torch(net, zero.optim))


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device; weights saved."""
    ranks = td.init_ranks(spec, spec.options["backend"], check=True)
    return probe_equivalence(
        spec, ranks, lambda net, feed, lr: training_step(spec, ranks, net, feed, lr, 0.0)[:2],
        strategy=STRATEGY)


if __name__ == "__main__":
    main(benchmark, equivalence)
