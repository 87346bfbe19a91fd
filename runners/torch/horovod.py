"""Horovod with PyTorch: one process (rank) per device, gradients averaged by Horovod's
DistributedOptimizer (ring all-reduce over gloo here; NCCL on GPUs).

Processes: the parent starts `horovodrun -np N --gloo -H localhost:N`; each rank calls
hvd.init() (the gloo controller finds its peers through horovodrun's rendezvous) and drives one
device, cuda:hvd.local_rank() on GPUs. On a CPU the N devices are N gloo processes sharing the
host's cores (virtual devices). horovodrun does not size the ranks' thread pools: the parent
sets OMP_NUM_THREADS to each rank's share of the cores (cores // N, bench/run/launch.py), and a
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
Count: the optimizer's step hooks count applied updates, independently of the loop; the ranks'
counts are exchanged with hvd.allreduce and must agree, and samples are their sum of images
stepped on. Global losses and each rank's threads are summed with hvd.allreduce too.
Placement: each rank's batch rows and device and its parameters' device, gathered with
hvd.allgather_object, keyed by hvd.rank() out of hvd.size(). State: after the timed window
each rank's parameters, .grad and optimizer state, whole replicas (runners/torch/state.py,
gathered with hvd.allgather_object); precision_policy: float32 throughout, the reduce dtype
float16 where the DistributedOptimizer compresses (its _compression is Compression.fp16:
follows false, said). What is not Horovod's own (the
input, the step counter, the timed loop, the checks, the placement and the result) is
runners/torch/dist.py's, shared with the torchrun runners. Equivalence runs the benchmark's step
function (DistributedOptimizer with the run's compression, resident-tensor input) on the
probe, one step of SGD without momentum.
Follows Horovod 0.28.1's PyTorch API as its pytorch_synthetic_benchmark.py example uses it
(DistributedOptimizer with op Average, broadcast_parameters, --fp16-allreduce as the
fp16_allreduce option); what differs: the harness's models (the 2017 CNNs, or a user's own
torch model, tokens or images, as torch_ddp takes it: runners/torch/dist.py's rank_model and
loss_of) and SGD with momentum 0.9 in
place of the example's torchvision model and plain SGD, and no Adasum option (Adasum is by
design not the 1-device step, so it could not pass the equivalence test).

Across nodes (a SLURM job, MGBENCH_NUM_NODES > 1): runners/torch/horovod_launch.py, started
on each node by srun, does what horovodrun 0.28.1's gloo launch does, except that it starts
the remote ranks through srun instead of ssh: the first node runs Horovod's RendezvousServer
with the host assignment plan of the job's nodes (devices_per_node slots each), and every
node starts its ranks with the slot environment horovodrun would give them (HOROVOD_RANK,
HOROVOD_CROSS_RANK, ..., HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_GLOO_IFACE). hvd.init()
then meets the other nodes' ranks exactly as under horovodrun. The result adds `nodes` (each
node with its ranks) and `multi_node` (what Horovod reports: size, local and cross sizes,
gloo built and enabled, every rank's rank/local_rank/cross_rank and node), gathered with
hvd.allgather_object; the placement stays keyed by hvd.rank(), one key per rank.

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

import torch
from torch import nn

from models import get_spec, load_builder
from models.torch_common import get_canonical_weights, set_canonical_weights
from runners.common import Invalid, Spec, Unavailable, main, node_identity
from runners.memory import model_state_torch
from runners.real_data import cores
from runners.torch.dist import (
    DeviceRank,
    Feed,
    PlacementTracker,
    StepCounter,
    equivalence_input,
    equivalence_step,
    gather_placement,
    loss_of,
    model_record,
    rank_model,
    threads_record,
    timed_steps,
    use_gpu,
)
from runners.torch.dist import framework_versions as torch_versions
from runners.torch.state import AFTER_WINDOW, grad_dtype, state_bytes, torch_precision

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
class HorovodRanks(DeviceRank):
    """A rank among the ranks horovodrun started, its collectives Horovod's."""

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        hvd = horovod()
        return hvd.allreduce(t, op=hvd.Sum)

    def gather(self, obj: Any) -> list[Any]:
        return list(horovod().allgather_object(obj))

    def placement(self, tracker: PlacementTracker) -> dict[str, Any]:
        """gather_placement over Horovod's ranks: hvd.rank() and hvd.size() as Horovod counts
        them, the rows gathered with hvd.allgather_object."""
        hvd = horovod()
        source = (f"Horovod (hvd.size()={hvd.size()}, controller {controller()}); each rank's "
                  "input-batch rows and device and its parameters' device, read from the "
                  "tensors it stepped on and gathered with hvd.allgather_object")
        return gather_placement(tracker, hvd.rank(), hvd.size(), self.gather, source)

    def record(self) -> dict[str, Any]:
        out = {"replicas": horovod().size(), "devices": self.devices,
               "controller": controller(), "rank_threads": threads_record(self, THREADS_NOTE)}
        if os.environ.get("MGBENCH_NUM_NODES", "1") != "1":
            out.update(multi_node_record())
        return out

    def close(self) -> None:
        horovod().shutdown()


MECHANISM = ("horovodrun's gloo rendezvous (RendezvousServer + slot environment), ranks "
             "started by srun instead of ssh (runners/torch/horovod_launch.py)")
RENDEZVOUS_ENV = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
                  "HOROVOD_GLOO_IFACE", "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")
SLOT_ENV = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
            "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


def multi_node_record() -> dict[str, Any]:
    """Where each rank of a multi-node run ran, gathered through Horovod itself
    (hvd.allgather_object of every rank's node_identity with hvd.rank(), local_rank(),
    cross_rank()), and what Horovod says of the ranks: `nodes` (one entry per node, its
    ranks) and `multi_node`. Invalid when Horovod's view is not the run's nodes x
    devices_per_node, or a rank's numbers are not the slot horovod_launch gave it."""
    hvd = horovod()
    rows = hvd.allgather_object({
        **node_identity(), "rank": hvd.rank(), "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "process_rank": os.environ.get("MGBENCH_PROCESS_RANK"),
        "slot_env": {k: os.environ.get(k) for k in SLOT_ENV}})
    nodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        node = nodes.setdefault(row["node"], {"node": row["node"], "host": row["host"],
                                              "slurm_procid": row["slurm_procid"],
                                              "ranks": []})
        node["ranks"].append(row["rank"])
    num_nodes = int(os.environ["MGBENCH_NUM_NODES"])
    if len(nodes) != num_nodes or hvd.cross_size() != num_nodes or \
            hvd.size() != num_nodes * hvd.local_size():
        raise Invalid(f"Horovod's ranks are {hvd.size()} on {sorted(nodes)} (cross_size "
                      f"{hvd.cross_size()}, local_size {hvd.local_size()}) for a run on "
                      f"{num_nodes} nodes")
    for row in rows:
        given = {k: row["slot_env"][f"HOROVOD_{k.upper()}"] for k in (
            "rank", "local_rank", "local_size", "cross_rank", "cross_size")}
        if any(str(row[k]) != v for k, v in given.items()):
            raise Invalid(f"rank {row['rank']} on {row['node']}: Horovod reports "
                          f"{ {k: row[k] for k in given} }, its slot was {given}")
    return {"nodes": list(nodes.values()), "multi_node": {
        "mechanism": MECHANISM,
        "rendezvous": {k: os.environ.get(k) for k in RENDEZVOUS_ENV},
        "world_size": hvd.size(), "size": hvd.size(), "cross_size": hvd.cross_size(),
        "local_size": hvd.local_size(), "controller": controller(),
        "gloo_built": hvd.gloo_built(), "gloo_enabled": hvd.gloo_enabled(),
        "mpi_built": hvd.mpi_built(), "mpi_enabled": hvd.mpi_enabled(),
        "ranks": rows}}


def controller() -> str:
    return "gloo" if horovod().gloo_enabled() else "mpi"


def framework_versions() -> dict[str, str]:
    import horovod as hvd_package

    return {**torch_versions(), "horovod": hvd_package.__version__}


def init_ranks(spec: Spec) -> HorovodRanks:
    """hvd.init(), pick this rank's device, and check horovodrun started one rank per device."""
    hvd = horovod()
    n = spec.num_devices
    gpu = spec.device == "gpu"
    if gpu and not hvd.nccl_built():
        raise Unavailable("device gpu: this Horovod build has no NCCL operations (built from "
                          "envs/horovod-cpu.txt; the GPU variant sets HOROVOD_GPU_OPERATIONS)")
    hvd.init()
    world = hvd.size()
    if world != n:
        raise Invalid(f"horovodrun started {world} ranks for a {n}-device run (is the "
                      "launcher horovodrun -np N?)")
    if gpu:
        device = use_gpu(hvd.local_rank(), hvd.local_size(), "envs/horovod-gpu.txt")
        me = {"name": torch.cuda.get_device_name(device), "kind": "GPU"}
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, cores() // hvd.local_size()))
        me = {"name": f"cpu (rank {hvd.rank()})", "kind": "virtual CPU device (gloo process)"}
    devices = hvd.allgather_object({**me, "rank": hvd.rank()})
    return HorovodRanks(hvd.rank(), hvd.local_rank(), world, device, devices)


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


def fp16_allreduce_in(optimizer: torch.optim.Optimizer) -> bool:
    """Whether Horovod's DistributedOptimizer compresses the gradients to float16 for the
    all-reduce, read from the optimizer it built (its _compression)."""
    return getattr(optimizer, "_compression", None) is horovod().Compression.fp16


def worker_context() -> str | None:
    """Horovod's examples start DataLoader workers with forkserver where it exists (fork is
    unsafe with some transports, e.g. InfiniBand verbs)."""
    import multiprocessing as mp

    return "forkserver" if "forkserver" in mp.get_all_start_methods() else None


def training_step(net: nn.Module, feed: Feed, lr: float, momentum: float, fp16_allreduce: bool
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
        loss = loss_of(tracker.computed(net(tracker.saw(x))), y)
        loss.backward()  # each gradient's all-reduce starts as soon as it is ready
        optimizer.step()  # waits for all of them, then applies the averaged gradient
        return loss.detach()

    return step, counter, tracker


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.precision != "fp32":
        raise Unavailable(f"precision {spec.precision!r}: this runner trains in fp32 (see "
                          "the fp16_allreduce option for fp16 gradient exchange)")
    fp16_allreduce = spec.options["fp16_allreduce"]
    ranks = init_ranks(spec)
    # the run's model (a built-in CNN or a user's torch model), seeded alike on every rank:
    # rank 0's weights are broadcast anyway; this makes runs repeatable
    model_spec, feed, net = rank_model(spec, ranks, "channels_first", worker_context())
    step, counter, tracker = training_step(net, feed, 0.01, 0.9, fp16_allreduce)
    result = timed_steps(spec, ranks, step, counter, tracker, feed)
    result.update({
        "framework": framework_versions(),
        "layout": "channels_first",
        "fp16_allreduce": fp16_allreduce,
        "strategy": "horovod.torch.DistributedOptimizer, one process per device (horovodrun); "
                    "gradients all-reduced (Average) as backward produces them",
        **model_record(net, model_spec),
        **model_state_torch(net, counter.optimizer),
        **state_bytes(ranks, net.parameters(), counter.optimizer.state.values(), AFTER_WINDOW),
        **torch_precision(spec.precision, tracker, net,
                          "float16" if fp16_allreduce_in(counter.optimizer) else grad_dtype(net),
                          "no autocast: float32 parameters and compute" + (
                              "; gradients all-reduced in float16 (hvd.Compression.fp16)"
                              if fp16_allreduce else "")),
    })
    ranks.close()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """The benchmark's step on the probe, Horovod's DistributedOptimizer around plain SGD
    (momentum 0, the same fp16_allreduce compression), every rank stepping on its slice of the
    batch; weights saved."""
    fp16_allreduce = spec.options["fp16_allreduce"]
    ranks = init_ranks(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    feed = equivalence_input(x, y, ranks, channels_first=True)
    net = load_builder("probe", "torch")(get_spec("probe"))
    set_canonical_weights(net, weights)
    net = net.to(ranks.device)
    step, counter, tracker = training_step(net, feed, lr, 0.0, fp16_allreduce)
    return equivalence_step(spec, ranks, step, counter, tracker,
                            lambda: get_canonical_weights(net), framework=framework_versions(),
                            layout="channels_first", fp16_allreduce=fp16_allreduce)


if __name__ == "__main__":
    main(benchmark, equivalence)
