"""Native PyTorch DistributedDataParallel: one process (rank) per device, started by torchrun.

Processes: the parent starts `torch.distributed.run --standalone --nproc-per-node=N`; each
rank joins one process group (backend `auto`: NCCL between GPUs, gloo on CPUs) and drives one
device, cuda:LOCAL_RANK on GPUs. On a CPU the N devices are N gloo processes sharing the
host's cores (virtual devices), each with the intra-op threads OMP_NUM_THREADS gives it
(torchrun's default is 1 per rank when N > 1 and nothing set it); records list them per rank.
Split: every rank holds its own B/N slice of the global batch, generated once on its device
(seeded by rank), so a step copies nothing from the host. Real data: each rank reads B/N
images per step from its DistributedSampler share of the JPEG file list through a DataLoader
with `workers` processes, pinned memory and a non_blocking copy on GPUs (DALI instead when it
is installed on a GPU machine; runners/torch/data.py); the timed window includes it.
Parameters: one full replica per rank; DDP broadcasts rank 0's at construction, so all
replicas start equal.
Reduce: each rank's loss is the mean cross-entropy over its slice; during backward DDP
all-reduces gradient buckets (NCCL or gloo, overlapped with the rest of backward) and divides
by N, so every rank holds the gradient of the global mean loss and applies the same SGD update
(synchronous data parallelism, identical to one device with batch B).
Synchronise: backward returns only when DDP's all-reduces are done, so the ranks are in step
without a barrier; on GPUs torch.cuda.synchronize() ends each timed step, and reading the loss
with .item() waits for the step on every device before the clock is read.
Count: the optimizer's own post-step hook counts applied steps, independently of the loop;
the ranks' counts must agree, and samples are their sum of images stepped on.
Placement: after the timed window each rank reports the rows and device of the batches it fed
the model and its parameters' device, gathered with dist.all_gather_object over the process
group whose backend and size (dist.get_backend(), get_world_size()) are checked against the
run's; keys "rank<r>:<device>" (rank1:cpu, rank1:cuda:1), counts the rows, which must add up
to the samples.
Equivalence: the benchmark's own step function (DDP, torch.compile when `compile`, the memory
format, autocast, the resident-tensor input) on the probe, one step of SGD without momentum.
Follows PyTorch 2.13's DDP as its tutorials use it (torchrun, DDP defaults, SGD); what
differs: synthetic data made on each device once (no DataLoader on synthetic runs).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runners.common import Invalid, Spec, main
from runners.memory import model_state_torch
from runners.torch.dist import (
    MEMORY_FORMATS,
    Feed,
    PlacementTracker,
    Ranks,
    Step,
    StepCounter,
    autocast,
    check_precision,
    framework_versions,
    init_ranks,
    model_record,
    probe_equivalence,
    rank_model,
    timed_steps,
    wrap_ddp,
)


def training_step(spec: Spec, ranks: Ranks, net: nn.Module, feed: Feed, lr: float,
                  momentum: float
                  ) -> tuple[Step, StepCounter, PlacementTracker, torch.amp.GradScaler | None]:
    """The one step function of both modes: `net` (on the rank's device) in DDP, compiled when
    the run says `compile`, SGD, the run's autocast (and GradScaler in fp16), the batch from
    `feed`; it returns this rank's loss."""
    model: nn.Module = wrap_ddp(net, ranks)
    if spec.options["compile"]:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    counter = StepCounter(optimizer)
    tracker = PlacementTracker(net)
    scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
    model.train()

    def step() -> torch.Tensor:
        x, y = feed.next()
        optimizer.zero_grad(set_to_none=True)
        with autocast(ranks, spec.precision):
            loss = F.cross_entropy(model(tracker.saw(x)).float(), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            counter.skipped += scaler.get_scale() < scale  # the scaler backs off after a skip
        return loss.detach()

    return step, counter, tracker, scaler


def compile_record(spec: Spec) -> dict[str, Any]:
    """Whether the step was compiled, with the graphs TorchDynamo captured (its own counters):
    a compiled run in which it captured none did not run the compiled step."""
    if not spec.options["compile"]:
        return {"compile": False}
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"]["unique_graphs"])
    if graphs < 1:
        raise Invalid("compile: true, but TorchDynamo captured no graph: the step ran eagerly")
    return {"compile": True, "compiled_graphs": graphs,
            "compiled_by": "torch.compile (TorchDynamo, Inductor) of the DDP module"}


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec.options
    layout = opts["memory_format"]
    ranks = init_ranks(spec, opts["backend"])
    check_precision(spec, ranks)
    model_spec, feed, net = rank_model(spec, ranks, layout)
    step, counter, tracker, scaler = training_step(spec, ranks, net, feed, 0.01, 0.9)
    result = timed_steps(spec, ranks, step, counter, tracker, feed)
    result.update({
        "framework": framework_versions(),
        "layout": layout,
        "memory_format": str(MEMORY_FORMATS[layout]),
        "precision_details": {"autocast": {"fp32": None, "tf32": None, "bf16": "bfloat16",
                                           "fp16": "float16"}[spec.precision],
                              "grad_scaler": scaler is not None,
                              "weights": "float32"},
        **compile_record(spec),
        "strategy": "torch.nn.parallel.DistributedDataParallel, one process per device "
                    "(torchrun); gradients all-reduced in buckets during backward",
        **model_record(net, model_spec),
        **model_state_torch(net, counter.optimizer),
    })
    ranks.close()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device as the synthetic input is; weights
    saved."""
    opts = spec.options
    layout = opts["memory_format"]
    ranks = init_ranks(spec, opts["backend"])
    check_precision(spec, ranks)

    def make_step(net: nn.Module, feed: Feed, lr: float
                  ) -> tuple[Step, StepCounter, PlacementTracker]:
        step, counter, tracker, _ = training_step(spec, ranks, net, feed, lr, 0.0)
        return step, counter, tracker

    result = probe_equivalence(spec, ranks, make_step, layout)
    return {**result, **compile_record(spec)}


if __name__ == "__main__":
    main(benchmark, equivalence)
