"""ZeRO stage 1 in native PyTorch: DistributedDataParallel with the optimizer state sharded over
the ranks by torch.distributed.optim.ZeroRedundancyOptimizer, one process (rank) per device,
started by torchrun, as PyTorch's tutorial "Shard Optimizer States with
ZeroRedundancyOptimizer" uses it (DDP(model), ZeroRedundancyOptimizer(model.parameters(),
optimizer_class=torch.optim.SGD, ...)).

Processes: as torch_ddp (runners/torch/ddp.py): torchrun starts N ranks, each joins the
process group (backend auto: NCCL between GPUs, gloo between virtual CPU devices) and drives
one device; the ranks, their input, the step counter, the timed steps and the placement are
runners/torch/dist.py's, shared with torch_ddp.
Split: every rank holds its own B/N slice of the global batch, made on its device once (or
its DistributedSampler share of the real data, as torch_ddp).
Parameters: one full replica per rank (DDP broadcasts rank 0's at construction); gradients a
full replica per rank too (DDP all-reduces them). Optimizer state: ZeroRedundancyOptimizer
partitions the parameters over the ranks (its greedy partition, largest parameter first, to
even out the elements per rank: whole parameters, never a slice of one) and each rank's local
torch.optim.SGD (its `optim`) holds the momentum buffers of its partition only.
Reduce: DDP all-reduces gradient buckets during backward and divides by N, as torch_ddp; then
ZeroRedundancyOptimizer.step() runs the local SGD over this rank's partition and broadcasts
each updated partition from its owner to every rank, so all replicas hold the same weights
after the step (synchronous data parallelism, identical to one device with batch B).
Synchronise: backward returns when DDP's all-reduces are done; step() returns when the
partitions' broadcasts are done; .item() on the loss (and torch.cuda.synchronize on GPUs)
ends each timed step, as torch_ddp.
Count: ZeroRedundancyOptimizer's own step hooks count the applied steps; the ranks' counts
must agree.
Placement: as torch_ddp, each rank's batch rows and device and its parameters' device,
gathered over the process group.
State: after the timed window (the last timed step's backward and step done; gradients are
kept until the next step's zero_grad), each rank's parameters and .grad (whole replicas) and
its local optimizer's state (`optim.state`), checked to be the parameters the partition
(ZeroRedundancyOptimizer._partition_parameters(), torch 2.13 has no public name for it)
assigns to this rank; the global optimizer size is the sum of the ranks' partitions
(runners/torch/state.py). The record adds `optimizer_partition`: each rank's parameters and
elements as the partition assigns them.
Precision: as torch_ddp: the run's torch.autocast (bf16 on CPUs and GPUs; fp16 with a
GradScaler on GPUs), float32 parameters (the master weights), gradients all-reduced in
float32; `precision_policy` reads them back.
Equivalence: the benchmark's step function (DDP, ZeroRedundancyOptimizer over plain SGD, no
momentum, the run's autocast, the resident-tensor input) on the probe, one step.
Follows PyTorch 2.13's ZeroRedundancyOptimizer tutorial; what differs: the harness's models,
SGD momentum 0.9 in place of the tutorial's Adam (the same optimizer as every strategy), and
synthetic data made on each device once. overlap_with_ddp is not offered: it needs DDP's
hook_with_zero_step communication hook and a functional optimizer, and its first two
iterations apply no update (its documentation), so one step on N devices could not be the
one-device step the equivalence test checks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from runners.common import Invalid, Spec, main
from runners.memory import model_state_torch
from runners.torch import dist as td
from runners.torch.state import AFTER_WINDOW, autocast_how, grad_dtype, state_bytes, torch_precision

STRATEGY = ("torch.nn.parallel.DistributedDataParallel with torch.distributed.optim."
            "ZeroRedundancyOptimizer (ZeRO-1: optimizer state partitioned over the ranks), one "
            "process per device (torchrun)")


def training_step(spec: Spec, ranks: td.Ranks, net: nn.Module, feed: td.Feed, lr: float,
                  momentum: float
                  ) -> tuple[td.Step, td.StepCounter, td.PlacementTracker,
                             torch.amp.GradScaler | None, ZeroRedundancyOptimizer]:
    """The one step function of both modes: `net` in DDP (its defaults, as the tutorial),
    ZeroRedundancyOptimizer over torch.optim.SGD(lr, momentum), the run's autocast (and a
    GradScaler in fp16), the batch from `feed` (dist.sgd_step)."""
    ddp = td.wrap_ddp(net, ranks)
    zero = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.SGD, lr=lr,
                                   momentum=momentum)
    counter = td.StepCounter(zero)
    tracker = td.PlacementTracker(net)
    scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
    ddp.train()
    return (td.sgd_step(ranks, spec.precision, ddp, zero, feed, tracker, counter, scaler),
            counter, tracker, scaler, zero)


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
        "source": "ZeroRedundancyOptimizer._partition_parameters() (whole parameters, greedy "
                  "by size); each rank's optim.param_groups and optim.state checked against "
                  "its share"}}


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
    ranks = td.init_ranks(spec, spec.options["backend"])
    td.check_precision(spec, ranks)
    model_spec, feed, net = td.rank_model(spec, ranks)
    step, counter, tracker, scaler, zero = training_step(spec, ranks, net, feed, 0.01, 0.9)
    result = td.timed_steps(spec, ranks, step, counter, tracker, feed)
    result.update({
        "framework": td.framework_versions(),
        "layout": "channels_first",
        "strategy": STRATEGY,
        "optimizer": {"class": "torch.distributed.optim.ZeroRedundancyOptimizer",
                      "optimizer_class": type(zero.optim).__name__},
        **partition_record(zero, ranks),
        **granular(state_bytes(ranks, net.parameters(), zero.optim.state.values(),
                               AFTER_WINDOW, partitioned=("optimizer",)), zero),
        **torch_precision(spec.precision, tracker, net, grad_dtype(net),
                          autocast_how(spec.precision, ranks, scaler),
                          "dynamic" if scaler is not None else None),
        **td.model_record(net, model_spec),
        **model_state_torch(net, zero.optim),
    })
    ranks.close()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device; weights saved."""
    ranks = td.init_ranks(spec, spec.options["backend"])
    td.check_precision(spec, ranks)

    def make_step(net: nn.Module, feed: td.Feed, lr: float
                  ) -> tuple[td.Step, td.StepCounter, td.PlacementTracker]:
        step, counter, tracker, _, _ = training_step(spec, ranks, net, feed, lr, 0.0)
        return step, counter, tracker

    return td.probe_equivalence(spec, ranks, make_step, strategy=STRATEGY)


if __name__ == "__main__":
    main(benchmark, equivalence)
