"""Horovod with PyTorch: one process (rank) per device, gradients averaged by Horovod's
DistributedOptimizer (ring all-reduce over gloo here; NCCL on GPUs).

Processes: the parent starts `horovodrun -np N --gloo -H localhost:N`; each rank calls
hvd.init() (the gloo controller finds its peers through horovodrun's rendezvous) and drives one
device, cuda:hvd.local_rank() on GPUs. On a CPU the N devices are N gloo processes sharing the
host's cores (virtual devices). horovodrun does not size the ranks' thread pools: the parent
sets OMP_NUM_THREADS to each rank's share of the cores (cores // N, bench/launch.py), and a
rank started by hand without it takes the same share itself; records list each rank's threads.
Split: every rank holds its own B/N slice of the global batch, generated once on its device
(seeded by rank), so a step copies nothing from the host. Real data: each rank reads B/N
images per step from its DistributedSampler share (num_replicas=hvd.size(), rank=hvd.rank(),
as Horovod's PyTorch examples do) of the JPEG file list through a DataLoader with `workers`
processes started by forkserver (Horovod's ImageNet example avoids fork), pinned memory and a
non_blocking copy on GPUs (DALI instead when installed there; runners/torch/data.py); the
timed window includes it. Parameters: one full replica per rank; hvd.broadcast_parameters
and hvd.broadcast_optimizer_state copy rank 0's weights, BatchNorm statistics and momentum
buffers to every rank before the first step.
Reduce: each rank's loss is the mean cross-entropy over its slice; during backward Horovod's
per-parameter hooks start an asynchronous all-reduce of each gradient as soon as it is ready
(fused into buffers by its background thread), with op Average, so every rank holds the
gradient of the global mean loss and applies the same SGD update (synchronous data
parallelism, identical to one device with batch B). Option fp16_allreduce casts gradients to
float16 for the all-reduce only (Compression.fp16) and back before the update.
Synchronise: optimizer.step() first waits for every outstanding all-reduce (synchronize()),
so after it the ranks have applied the same update; on GPUs torch.cuda.synchronize() ends
each timed step, and reading the loss with .item() waits for the step before the clock is read.
Count: an optimizer step hook counts applied updates, independently of the loop; the ranks'
counts are all-gathered and must agree, and samples are their sum of images stepped on.
Placement: each rank's batch rows and device and its parameters' device, gathered with
hvd.allgather_object, keyed by hvd.rank() out of hvd.size() (runners.torch.dist's
gather_placement, shared with the torchrun runners). Equivalence runs the benchmark's step
function (DistributedOptimizer with the run's compression, resident-tensor input) on the
probe, one step of SGD without momentum.
Follows Horovod 0.28.1's PyTorch API as its pytorch_synthetic_benchmark.py example uses it
(DistributedOptimizer with op Average, broadcast_parameters, --fp16-allreduce as the
fp16_allreduce option); what differs: the harness's models and SGD with momentum 0.9 in
place of the example's torchvision model and plain SGD, and no Adasum option (Adasum is by
design not the 1-device step, so it could not pass the equivalence test).

Horovod's TensorFlow binding is not built (HOROVOD_WITHOUT_TENSORFLOW in
envs/horovod_build.py): it would put a second framework into this environment, and
TensorFlow 2.21 with Horovod 0.28.1 (released for TF 2.12) is untested; PyTorch is the
binding this runner measures. See envs/horovod_build.py for the source build itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models import ModelSpec, get_spec, load_builder
from models.torch_common import (
    count_flops_torch,
    count_params_torch,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import (
    Invalid,
    Spec,
    StepTimer,
    Unavailable,
    finite,
    load_equivalence_inputs,
    main,
    save_equivalence_output,
)
from runners.real_data import check_classes, open_dataset
from runners.torch.data import RealInput, SyntheticInput, open_input
from runners.torch.dist import (
    PlacementTracker,
    check_rows,
    equivalence_input,
    gather_placement,
    per_rank_batch,
    synchronize,
    synthetic_slice,
)

THREADS_NOTE = ("horovodrun leaves thread pools alone; the harness sets OMP_NUM_THREADS to "
                "cores // N (or, unset, each rank sets torch threads to cores // ranks), so N "
                "ranks share the cores one process would use")


@functools.cache
def horovod() -> Any:
    """horovod.torch, imported inside main() so that a broken install becomes a record."""
    import horovod.torch as hvd

    if not hasattr(hvd, "init"):  # the package imports without its extension, half empty
        raise Unavailable("horovod.torch has no compiled extension in this environment "
                          "(rebuild it: `run_bench.py setup horovod`)")
    return hvd


@dataclass(frozen=True)
class Ranks:
    """This process's place among the Horovod ranks and the device it drives."""

    rank: int
    local_rank: int
    world: int
    device: torch.device
    devices: list[dict[str, Any]]  # one entry per rank, for the record
    threads: dict[str, Any]

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def framework_versions() -> dict[str, str]:
    import horovod as hvd_package

    return {"torch": torch.__version__, "horovod": hvd_package.__version__,
            "numpy": np.__version__}


def cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def init_ranks(spec: Spec) -> Ranks:
    """hvd.init(), pick this rank's device, and check horovodrun started one rank per device."""
    hvd = horovod()
    n = spec.num_devices
    gpu = spec.device == "gpu"
    if gpu and not torch.cuda.is_available():
        raise Unavailable(f"device gpu: torch {torch.__version__} sees no CUDA GPU"
                          + ("" if torch.version.cuda else
                             " (a CPU-only build: install envs/horovod-gpu.txt)"))
    if gpu and not hvd.nccl_built():
        raise Unavailable("device gpu: this Horovod build has no NCCL operations (built from "
                          "envs/horovod-cpu.txt; the GPU variant sets HOROVOD_GPU_OPERATIONS)")
    hvd.init()
    world = hvd.size()
    if world != n:
        raise Invalid(f"horovodrun started {world} ranks for a {n}-device run (is the "
                      "launcher horovodrun -np N?)")
    if gpu:
        if torch.cuda.device_count() < hvd.local_size():
            raise Unavailable(f"needs {hvd.local_size()} GPUs on this host; torch sees "
                              f"{torch.cuda.device_count()}")
        device = torch.device("cuda", hvd.local_rank())
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # autotune convolutions (warm-up pays for it)
        me = {"name": torch.cuda.get_device_name(device), "kind": "GPU"}
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, cores() // hvd.local_size()))
        me = {"name": f"cpu (rank {hvd.rank()})", "kind": "virtual CPU device (gloo process)"}
    me.update(rank=hvd.rank(), torch_threads=torch.get_num_threads(),
              OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS"), pid=os.getpid())
    everyone = hvd.allgather_object(me)
    devices = [{k: d[k] for k in ("name", "kind", "rank")} for d in everyone]
    threads = {
        "per_rank": [{k: d[k] for k in ("rank", "torch_threads", "OMP_NUM_THREADS")}
                     for d in everyone],
        "cpu_count": cores(),
        "processes": len({d["pid"] for d in everyone}),
        "launcher": f"horovodrun started {world} process{'es' if world > 1 else ''} "
                    f"(controller {'gloo' if hvd.gloo_enabled() else 'mpi'})",
        "note": THREADS_NOTE,
    }
    return Ranks(hvd.rank(), hvd.local_rank(), world, device, devices, threads)


class StepCounter:
    """Counts applied optimizer steps through the optimizer's step hooks, so the count does not
    come from the loop that claims to have run them.

    DistributedOptimizer.step() calls the wrapped optimizer's step(), and torch runs the hooks
    around both; a pre-hook arms the count and the first post-hook takes it, so a step counts
    once however deep the nesting."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.applied = 0
        self._armed = False
        optimizer.register_step_pre_hook(self._arm)
        optimizer.register_step_post_hook(self._count)

    def _arm(self, *_: Any) -> None:
        self._armed = True

    def _count(self, *_: Any) -> None:
        if self._armed:
            self.applied += 1
            self._armed = False


def distributed_sgd(model: nn.Module, lr: float, momentum: float, fp16_allreduce: bool
                    ) -> torch.optim.Optimizer:
    """SGD wrapped in hvd.DistributedOptimizer (gradients averaged over ranks), with rank 0's
    weights, buffers and optimizer state broadcast to every rank."""
    hvd = horovod()
    compression = hvd.Compression.fp16 if fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
        named_parameters=model.named_parameters(), compression=compression, op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    return optimizer


def gather_ints(value: int) -> list[int]:
    """value from every rank, in rank order."""
    hvd = horovod()
    return [int(v) for v in hvd.allgather(torch.tensor([value], dtype=torch.int64)).tolist()]


def global_mean_losses(losses: list[float]) -> list[float]:
    """Each step's loss averaged over the ranks (every rank's slice has the same size), so the
    global mean cross-entropy of the step's batch; one all-reduce after the timed window."""
    hvd = horovod()
    t = torch.tensor(losses, dtype=torch.float64)
    return [float(v) for v in hvd.allreduce(t, op=hvd.Average, name="losses").tolist()]


def horovod_placement(tracker: PlacementTracker) -> dict[str, Any]:
    """runners.torch.dist.gather_placement over Horovod's ranks: hvd.rank() and hvd.size() as
    Horovod counts them, the rows gathered with hvd.allgather_object."""
    hvd = horovod()
    source = (f"Horovod (hvd.size()={hvd.size()}, controller "
              f"{'gloo' if hvd.gloo_enabled() else 'mpi'}); each rank's input-batch rows and "
              "device and its parameters' device, read from the tensors it stepped on and "
              "gathered with hvd.allgather_object")
    return gather_placement(tracker, hvd.rank(), hvd.size(), hvd.allgather_object, source)


def timed_steps(spec: Spec, ranks: Ranks, step: Callable[[], torch.Tensor],
                counter: StepCounter, batch_per_rank: int, tracker: PlacementTracker
                ) -> dict[str, Any]:
    """Warm up, then time measure_steps steps; the timer summary, the global losses and the
    placement of the timed steps (`step` shows `tracker` each batch it feeds).

    `step` runs one whole training step and returns this rank's loss (a device tensor)."""
    for _ in range(spec.warmup_steps):
        step().item()
    synchronize(ranks)
    applied0 = counter.applied
    tracker.reset()
    timer, losses = StepTimer(), []
    timer.start()
    for _ in range(spec.measure_steps):
        loss = step()
        synchronize(ranks)
        losses.append(loss.item())  # the step, all-reduces included, has finished on this rank
        timer.tick()
    if not losses:
        raise Invalid("measure_steps is 0: nothing was timed")
    steps = gather_ints(counter.applied - applied0)
    if len(set(steps)) != 1:
        raise Invalid(f"ranks disagree on the steps applied: {steps}")
    global_losses = global_mean_losses(losses)
    samples = sum(s * batch_per_rank for s in steps)
    placement = horovod_placement(tracker)
    check_rows(placement["placement"], samples)
    return {
        **placement,
        **timer.summary(spec.global_batch_size, samples),
        "first_loss": finite(global_losses[0]),
        "last_loss": finite(global_losses[-1]),
        "loss_kind": "global mean cross-entropy of each step's batch (ranks' means averaged)",
        "steps_per_rank": steps,
    }


def nchw(model_spec: ModelSpec) -> tuple[int, int, int]:
    h, w, c = model_spec.input_shape
    return (c, h, w)


def worker_context() -> str | None:
    """Horovod's examples start DataLoader workers with forkserver where it exists (fork is
    unsafe with some transports, e.g. InfiniBand verbs)."""
    import multiprocessing as mp

    return "forkserver" if "forkserver" in mp.get_all_start_methods() else None


def rank_input(spec: Spec, ranks: Ranks, model_spec: ModelSpec, batch: int
               ) -> SyntheticInput | RealInput:
    """This rank's synthetic slice, or on real data its DistributedSampler share."""
    if spec.data != "real":
        return SyntheticInput(*synthetic_slice(ranks, nchw(model_spec), model_spec.num_classes,
                                               batch))
    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
    return open_input(spec, data, model_spec.input_shape[0], batch, ranks.rank, ranks.world,
                      ranks.device, context=worker_context())


def training_step(net: nn.Module, feed: SyntheticInput | RealInput, lr: float, momentum: float,
                  fp16_allreduce: bool
                  ) -> tuple[Callable[[], torch.Tensor], StepCounter, PlacementTracker]:
    """The one step function of both modes: `net` (on the rank's device, in train mode) with
    distributed_sgd, the batch from `feed`; it returns this rank's loss."""
    optimizer = distributed_sgd(net, lr, momentum, fp16_allreduce)
    counter = StepCounter(optimizer)
    tracker = PlacementTracker(net)
    net.train()

    def step() -> torch.Tensor:
        x, y = feed.next()
        optimizer.zero_grad()  # Horovod's takes no set_to_none; torch's default is True
        loss = F.cross_entropy(net(tracker.saw(x)), y)
        loss.backward()  # each gradient's all-reduce starts as soon as it is ready
        optimizer.step()  # waits for all of them, then applies the averaged gradient
        return loss.detach()

    return step, counter, tracker


def benchmark(spec: Spec) -> dict[str, Any]:
    hvd = horovod()
    if spec.precision != "fp32":
        raise Unavailable(f"precision {spec.precision!r}: this runner trains in fp32 (see "
                          "the fp16_allreduce option for fp16 gradient exchange)")
    fp16_allreduce = bool(spec.options["fp16_allreduce"])
    ranks = init_ranks(spec)
    batch = per_rank_batch(spec, ranks)
    model_spec = get_spec(spec.model)
    feed = rank_input(spec, ranks, model_spec, batch)
    torch.manual_seed(0)  # rank 0's weights are broadcast anyway; this makes runs repeatable
    net = load_builder(spec.model, "torch")(model_spec).to(ranks.device)
    step, counter, tracker = training_step(net, feed, 0.01, 0.9, fp16_allreduce)
    result = timed_steps(spec, ranks, step, counter, batch, tracker)
    result.update({
        "replicas": hvd.size(),
        "framework": framework_versions(),
        "devices": ranks.devices,
        "layout": "channels_first",
        "fp16_allreduce": fp16_allreduce,
        "controller": "gloo" if hvd.gloo_enabled() else "mpi",
        "strategy": "horovod.torch.DistributedOptimizer, one process per device (horovodrun); "
                    "gradients all-reduced (Average) as backward produces them",
        "batch_size_per_rank": batch,
        "rank_threads": ranks.threads,  # "threads" is runners.common's (rank 0)
        "params": count_params_torch(net),
        "flops_per_sample": count_flops_torch(net, nchw(model_spec)),
    })
    result.update(feed.record())
    feed.close()
    hvd.shutdown()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device as the synthetic input is; weights
    saved."""
    hvd = horovod()
    fp16_allreduce = bool(spec.options["fp16_allreduce"])
    ranks = init_ranks(spec)
    weights, x, y, lr = load_equivalence_inputs(spec)
    feed = equivalence_input(x, y, ranks, channels_first=True)
    net = load_builder("probe", "torch")(get_spec("probe"))
    set_canonical_weights(net, weights)
    net = net.to(ranks.device)
    step, counter, tracker = training_step(net, feed, lr, 0.0, fp16_allreduce)
    tracker.reset()
    applied0 = counter.applied
    loss = step()
    synchronize(ranks)
    steps = gather_ints(counter.applied - applied0)
    if steps != [1] * ranks.world:
        raise Invalid(f"the equivalence step applied {steps} optimizer steps per rank, not 1")
    global_loss = finite(global_mean_losses([loss.item()])[0])
    placement = horovod_placement(tracker)
    if ranks.rank == 0:
        save_equivalence_output(spec, get_canonical_weights(net))
    result = {**placement, "replicas": hvd.size(), "framework": framework_versions(),
              "devices": ranks.devices, "loss": global_loss, "layout": "channels_first",
              "fp16_allreduce": fp16_allreduce}
    hvd.shutdown()
    return result


if __name__ == "__main__":
    main(benchmark, equivalence)
