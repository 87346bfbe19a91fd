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
Models: the 2017 CNNs, the transformers (gpt2, vit_b16 and their tiny versions) and a user's
own torch model (a `models:` entry, models/custom.py), through runners/torch/dist.py's
rank_model. A token model's slice is random ids (B/N, T + 1) made on the device once, inputs
ids[:, :-1] and next-token targets ids[:, 1:]; its loss is the mean cross-entropy over every
position, on float32 logits. Parameters and FLOPs in the result: a CNN's counted over its
layers, a built-in transformer's the spec's standard count, a user's model's by torch's
FlopCounterMode.
Reduce: each rank's loss is the mean cross-entropy over its slice; during backward DDP
all-reduces gradient buckets (NCCL or gloo, overlapped with the rest of backward) and divides
by N, so every rank holds the gradient of the global mean loss and applies the same SGD update
(synchronous data parallelism, identical to one device with batch B). With
gradient_as_bucket_view (the default) the gradients are views into DDP's buckets, not copies.
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
State: after the timed window each rank's parameters, their .grad and the optimizer's state,
whole replicas on every rank (runners/torch/state.py: state_bytes_per_device, each equal to
state_bytes_global). precision_policy: the dtype the logits came out of autocast in, the
parameters' dtype and the gradients' (DDP all-reduces the buckets in the gradients' dtype).
Equivalence: the benchmark's own step function (DDP, torch.compile when `compile`, the memory
format, autocast, the optimizer implementation, gradient bucket views, the resident-tensor
input) on the probe, one step of SGD without momentum.
Defaults: on GPUs what NVIDIA's DeepLearningExamples and Lambda's PyTorch benchmark scripts
use: channels_last, torch.compile, cudnn.benchmark, the fused SGD kernel, gradient bucket
views, data resident on the device (the catalog's gpu_default of each option); on CPUs what is
fastest there (channels_first, eager, foreach SGD). Each is in the run's options and the
result says what torch reports back (torch.backends.cudnn.benchmark, the optimizer's
foreach/fused, DDP's gradient_as_bucket_view, the graphs TorchDynamo captured).
Converge (mode converge, runners/converge.py): the same model, DDP, compile, memory format,
autocast and optimizer implementation (ddp_parts), trained by the ranks' own loop over the
recipe's global batches, each rank its rows of each (runners/torch/dist.py ConvergeLoop): SGD
with the recipe's momentum and weight decay, the learning rate written into the optimizer's
param groups before every step, initial weights from torch.manual_seed(recipe.seed) (DDP
broadcasts rank 0's in any case). Each rank's loss is its summed cross-entropy x world / the
global batch's rows, so DDP's averaged gradient is the global batch's mean loss's even for a
short kept batch split unevenly. After every epoch rank 0 evaluates the held-out split with the
plain module in eval mode (BatchNorm's running statistics; outside DDP, whose broadcast_buffers
leaves the ranks' statistics differing after the last step) and shares the accuracy with an
all-reduce, so every rank stops at the same epoch; the running means and variances of every
rank are checked finite. Placement counts each rank's training rows over all epochs.
Follows PyTorch 2.13's DDP as its tutorials use it (torchrun, DDP, SGD); what differs:
synthetic data made on each device once (no DataLoader on synthetic runs); in converge, the
splits held in memory, each step's rows copied to the device (no DistributedSampler: the
recipe's batches are every runner's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from models import ModelSpec, spec_of
from runners.common import Invalid, Spec, main
from runners.memory import model_state_torch
from runners.torch.dist import (
    MEMORY_FORMATS,
    ConvergeLoop,
    Feed,
    PlacementTracker,
    Ranks,
    Step,
    StepCounter,
    build_model,
    check_precision,
    converge_splits,
    framework_versions,
    init_ranks,
    model_record,
    probe_equivalence,
    rank_model,
    rank_shares,
    sgd_step,
    timed_steps,
    torch_bn_stats,
    wrap_ddp,
)
from runners.torch.state import AFTER_WINDOW, autocast_how, grad_dtype, state_bytes, torch_precision

OPTIMIZER_IMPLS = {"foreach": {"foreach": True}, "fused": {"fused": True},
                   "for-loop": {"foreach": False}}


def set_cudnn_benchmark(spec: Spec, ranks: Ranks) -> dict[str, Any]:
    """torch.backends.cudnn.benchmark as the run's option says (GPUs), read back; on CPUs
    there is no cuDNN and the option does nothing, recorded as such."""
    wanted = spec.options["cudnn_benchmark"]
    if ranks.cuda:
        torch.backends.cudnn.benchmark = wanted
    return {"cudnn_benchmark": {"option": wanted,
                                "torch.backends.cudnn.benchmark": torch.backends.cudnn.benchmark,
                                "in_effect": ranks.cuda and torch.backends.cudnn.is_available(),
                                **({} if ranks.cuda else {"note": "no-op on CPU (no cuDNN)"})}}


def ddp_parts(spec: Spec, ranks: Ranks, net: nn.Module, lr: float, momentum: float,
              weight_decay: float = 0.0
              ) -> tuple[nn.Module, StepCounter, PlacementTracker, torch.amp.GradScaler | None,
                         dict[str, Any]]:
    """What the step function of every mode is made of: `net` (on the rank's device) in DDP
    (gradients as bucket views when the run says so), compiled when the run says `compile`;
    SGD in the run's `optimizer_impl` (counted: StepCounter); the GradScaler of fp16. The last
    item is what DDP and the optimizer report of those settings."""
    ddp = wrap_ddp(net, ranks, spec.options["gradient_as_bucket_view"])
    model: nn.Module = ddp
    if spec.options["compile"]:
        model = torch.compile(model)
    impl = spec.options["optimizer_impl"]
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay, **OPTIMIZER_IMPLS[impl])
    counter = StepCounter(optimizer)
    tracker = PlacementTracker(net)
    scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
    model.train()
    reported = {"optimizer": {"impl": impl, "class": "torch.optim.SGD",
                              "foreach": optimizer.defaults.get("foreach"),
                              "fused": optimizer.defaults.get("fused")},
                "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view)}
    return model, counter, tracker, scaler, reported


def training_step(spec: Spec, ranks: Ranks, net: nn.Module, feed: Feed, lr: float,
                  momentum: float
                  ) -> tuple[Step, StepCounter, PlacementTracker, torch.amp.GradScaler | None,
                             dict[str, Any]]:
    """The benchmark's and equivalence's step function (ddp_parts), the batch from `feed`; it
    returns this rank's loss (next-token cross-entropy for a token model, loss_of)."""
    model, counter, tracker, scaler, reported = ddp_parts(spec, ranks, net, lr, momentum)
    step = sgd_step(ranks, spec.precision, model, counter.optimizer, feed, tracker, counter,
                    scaler)
    return step, counter, tracker, scaler, reported


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


def run_fields(spec: Spec, ranks: Ranks, net: nn.Module, model_spec: ModelSpec,
               counter: StepCounter, tracker: PlacementTracker,
               scaler: torch.amp.GradScaler | None, when: str) -> dict[str, Any]:
    """What a benchmark and a converge result say of the run alike: versions, layout,
    precision, compilation, the model, its state (read `when`)."""
    layout = spec.options["memory_format"]
    return {
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
        **state_bytes(ranks, net.parameters(), counter.optimizer.state.values(), when),
        **torch_precision(spec.precision, tracker, net, grad_dtype(net),
                          autocast_how(spec.precision, ranks, scaler),
                          "dynamic" if scaler is not None else None),
    }


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec.options
    layout = opts["memory_format"]
    ranks = init_ranks(spec, opts["backend"])
    check_precision(spec, ranks)
    cudnn = set_cudnn_benchmark(spec, ranks)
    model_spec, feed, net = rank_model(spec, ranks, layout)
    step, counter, tracker, scaler, reported = training_step(spec, ranks, net, feed, 0.01, 0.9)
    result = timed_steps(spec, ranks, step, counter, tracker, feed)
    result.update({**run_fields(spec, ranks, net, model_spec, counter, tracker, scaler,
                                AFTER_WINDOW), **cudnn, **reported})
    ranks.close()
    return result


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge (runners/converge.py): the benchmark's model, DDP and step parts
    (ddp_parts: compile, memory format, autocast, optimizer implementation, bucket views) in
    this rank's loop over its share of each of the recipe's global batches, SGD with the
    recipe's momentum and weight decay, the learning rate set in the optimizer's param groups
    before every step; initial weights from torch.manual_seed(recipe.seed) (DDP broadcasts
    rank 0's anyway); held-out accuracy on rank 0 (ConvergeLoop)."""
    from runners.converge import Recipe, train_to_accuracy

    opts = spec.options
    layout = opts["memory_format"]
    recipe = Recipe.of(spec)
    ranks = init_ranks(spec, opts["backend"])
    check_precision(spec, ranks)
    cudnn = set_cudnn_benchmark(spec, ranks)
    model_spec = spec_of(spec)
    splits = converge_splits(spec, model_spec)
    torch.manual_seed(recipe.seed)
    net = build_model(spec, model_spec, layout, ranks.device)
    model, counter, tracker, scaler, reported = ddp_parts(
        spec, ranks, net, recipe.base_lr, recipe.momentum, recipe.weight_decay)
    memory_format = MEMORY_FORMATS[layout]

    def to_input(x: np.ndarray) -> torch.Tensor:  # NHWC pixels -> NCHW in the memory format
        t = torch.from_numpy(x).to(ranks.device).permute(0, 3, 1, 2)
        return t.contiguous(memory_format=memory_format)

    def infer(x: torch.Tensor) -> torch.Tensor:
        net.eval()
        try:
            return net(x)
        finally:
            net.train()

    loop = ConvergeLoop(ranks, spec.precision, model, infer, to_input, counter, tracker,
                        lambda: torch_bn_stats(net), scaler)
    result = train_to_accuracy(spec, loop.train_epoch, loop.evaluate, loop.moving_stats,
                               ranks.rank, ranks.world, splits)
    result.update({**loop.record(result["samples"]),
                   **run_fields(spec, ranks, net, model_spec, counter, tracker, scaler,
                                "after the last epoch's last step"),
                   **cudnn, **reported,
                   "batch_size_per_rank": rank_shares(spec.global_batch_size, ranks.world),
                   "loop": "torchrun ranks' own loop over the recipe's batches (this rank's "
                           "rows of each), optimizer.param_groups' lr set before each step",
                   "input": "the dataset's splits (splits.npz) in memory; each rank's rows "
                            "copied to its device per step"})
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
    cudnn = set_cudnn_benchmark(spec, ranks)
    reported: dict[str, Any] = {}

    def make_step(net: nn.Module, feed: Feed, lr: float
                  ) -> tuple[Step, StepCounter, PlacementTracker]:
        step, counter, tracker, _, own = training_step(spec, ranks, net, feed, lr, 0.0)
        reported.update(own)
        return step, counter, tracker

    result = probe_equivalence(spec, ranks, make_step, layout)
    return {**result, **compile_record(spec), **cudnn, **reported}


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
