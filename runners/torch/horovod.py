"""horovod: Horovod 0.28.1 with PyTorch, one process per device started by horovodrun, gradients
averaged by hvd.DistributedOptimizer after hvd.broadcast_parameters; option fp16_allreduce.
Ranks: horovod_ranks.py; input, timed loop and result: runners/torch/dist.py. Follows Horovod's
pytorch_synthetic_benchmark.py; differs: the harness's models, SGD momentum 0.9, no Adasum.
docs/runners/horovod.md."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import torch
from torch import nn

from contract.reasons import code
from runners.common import Spec, Unavailable, main
from runners.memory import model_state_torch
from runners.torch import dist as td
from runners.torch.equivalence import probe_equivalence
from runners.torch.horovod_ranks import horovod, init_ranks
from runners.torch.state import AFTER_WINDOW, grad_dtype, state_bytes, torch_precision


def training_step(net: nn.Module, feed: td.Feed, lr: float, momentum: float, fp16_allreduce: bool
                  ) -> tuple[td.Step, td.StepParts]:
    """The one step function of both modes: `net` (on the rank's device, in train mode), SGD
    wrapped in hvd.DistributedOptimizer (gradients averaged over ranks) with rank 0's weights,
    buffers and optimizer state broadcast to every rank, the batch from `feed`; it returns
    this rank's loss."""
    hvd = horovod()
    compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum),
        named_parameters=net.named_parameters(), compression=compression, op=hvd.Average)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    counter = td.StepCounter(optimizer)
    tracker = td.PlacementTracker(net)
    net.train()

    def step() -> torch.Tensor:
        x, y = feed.next()
        optimizer.zero_grad()  # Horovod's takes no set_to_none; torch's default is True
        loss = td.loss_of(tracker.computed(net(tracker.saw(x))), y)
        loss.backward()  # each gradient's all-reduce starts as soon as it is ready
        optimizer.step()  # waits for all of them, then applies the averaged gradient
        return loss.detach()

    return step, td.StepParts(net, counter, tracker)


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.precision != "fp32":
        raise Unavailable(f"precision {spec.precision!r}: this runner trains in fp32 (see "
                          "the fp16_allreduce option for fp16 gradient exchange)")
    fp16_allreduce = spec.options["fp16_allreduce"]
    ranks = init_ranks(spec)
    # DataLoader workers started with forkserver where it exists, as Horovod's examples do
    # (fork is unsafe with some transports, e.g. InfiniBand verbs)
    context = "forkserver" if "forkserver" in mp.get_all_start_methods() else None
    # the run's model (a built-in CNN or a user's torch model), seeded alike on every rank:
    # rank 0's weights are broadcast anyway; this makes runs repeatable
    model_spec, feed, net = td.rank_model(spec, ranks, "channels_first", context)
    step, parts = training_step(net, feed, 0.01, 0.9, fp16_allreduce)
    optimizer = parts.optimizer
    result = td.timed_steps(spec, ranks, step, parts.counter, parts.tracker, feed)
    return td.closing(ranks, result, {
        "framework": td.framework_versions("horovod"),
        "layout": "channels_first",
        "fp16_allreduce": fp16_allreduce,
        "strategy": code("torch.horovod_strategy"),
    }, td.model_record(net, model_spec), model_state_torch(net, optimizer),
        state_bytes(ranks, net.parameters(), optimizer.state.values(), AFTER_WINDOW),
        torch_precision(spec.precision, parts.tracker, net,
                        # the compression DistributedOptimizer built, read back
                        "float16" if getattr(optimizer, "_compression", None)
                        is horovod().Compression.fp16 else grad_dtype(net),
                        "no autocast: float32 parameters and compute" + (
                            "; gradients all-reduced in float16 (hvd.Compression.fp16)"
                            if fp16_allreduce else "")))


def equivalence(spec: Spec) -> dict[str, Any]:
    """The benchmark's step on the probe, Horovod's DistributedOptimizer around plain SGD
    (momentum 0, the same fp16_allreduce compression), every rank stepping on its slice of the
    batch; weights saved."""
    fp16_allreduce = spec.options["fp16_allreduce"]
    ranks = init_ranks(spec)
    return probe_equivalence(
        spec, ranks, lambda net, feed, lr: training_step(net, feed, lr, 0.0, fp16_allreduce),
        framework=td.framework_versions("horovod"), fp16_allreduce=fp16_allreduce)


if __name__ == "__main__":
    main(benchmark, equivalence)
