"""The PyTorch runners' ranks, one process per device: torchrun's (`Ranks`: the process group
of torch_ddp and keras_torch, each rank's device) and Horovod's (horovod.py), both DeviceRanks
whose collectives are their framework's own. Shared over a DeviceRank: each rank's input (the
synthetic slice, or its share of the real data through runners/torch/data.py), the step
counter, the timed steps (runners.common.timed_loop), the cross-rank checks and global losses,
every rank's threads, the placement read back from the ranks (PlacementTracker,
gather_placement) and the result; mode converge's loop over a runner's step parts
(ConvergeLoop). Imports torch: child processes only.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from models import ModelSpec, build_for, get_spec, load_builder, model_fields, spec_of
from models.custom import CustomModelError, check_output, not_a_model
from models.torch_common import count_flops_torch, count_params_torch, describe
from runners.common import (
    Invalid,
    Spec,
    Unavailable,
    finite,
    node_identity,
    rows_per_device,
    timed_loop,
)
from runners.real_data import check_classes, cores, open_dataset
from runners.torch.data import RealInput, SyntheticInput, open_input

MEMORY_FORMATS = {"channels_first": torch.contiguous_format, "channels_last": torch.channels_last}
# The process group, referenced until the process exits (runners.common ends it with os._exit),
# so its destructor never runs. Seen on torch 2.13 with gloo, mostly in keras_torch: the main
# thread, freeing the DDP reducer and with it the last reference to the process group, holds
# the GIL and joins gloo's worker thread, which is freeing a finished all-reduce whose tensors
# have Python objects and waits for the GIL: a deadlock at teardown, after rank 0's peer exited.
_KEEP_ALIVE: list[Any] = []
THREADS_NOTE = ("each rank's intra-op threads follow OMP_NUM_THREADS as it found it: the "
                "harness's share of the host's cores per rank, or, if nothing set it, torchrun's "
                "default of 1 per rank when it starts more than one (all cores for one rank)")
Feed = SyntheticInput | RealInput
Step = Callable[[], torch.Tensor]  # one training step on this rank; returns its loss


@dataclass(frozen=True)
class DeviceRank(ABC):
    """This process's place among the ranks and the device it drives, whatever started them:
    torchrun's Ranks below, Horovod's in horovod.py. The collectives are the framework's own;
    every rank calls them in the same order."""

    rank: int
    local_rank: int
    world: int
    device: torch.device
    devices: list[dict[str, Any]]  # one entry per rank, for the record

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @abstractmethod
    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (on this rank's device) summed over the ranks."""

    @abstractmethod
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, through the framework's own
        collective (dist.all_gather_object, hvd.allgather_object)."""

    @abstractmethod
    def placement(self, tracker: PlacementTracker) -> dict[str, Any]:
        """gather_placement over the ranks, as the framework counts them."""

    @abstractmethod
    def record(self) -> dict[str, Any]:
        """What the result says of the ranks: replicas, devices, how they communicate, the
        threads of every rank."""

    @abstractmethod
    def close(self) -> None:
        """Leave the ranks' group."""


@dataclass(frozen=True)
class Ranks(DeviceRank):
    """A torchrun rank in the torch.distributed process group."""

    backend: str

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t)
        return t

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def placement(self, tracker: PlacementTracker) -> dict[str, Any]:
        """gather_placement over the process group, whose backend and size are read back from
        it and checked against the run's."""
        backend, world = dist.get_backend(), dist.get_world_size()
        if backend != self.backend or world != self.world:
            raise Invalid(f"the process group is {backend} with {world} ranks; the run asked "
                          f"for {self.backend} with {self.world}")
        source = (f"torch.distributed process group (get_backend()={backend}, get_world_size()="
                  f"{world}); each rank's input-batch rows and device and its parameters' "
                  "device, read from the tensors it stepped on and gathered with "
                  "all_gather_object")
        return gather_placement(tracker, dist.get_rank(), world, self.gather, source)

    def record(self) -> dict[str, Any]:
        out = {"replicas": self.world, "devices": self.devices, "backend": self.backend,
               "rank_threads": threads_record(self, THREADS_NOTE)}
        if os.environ.get("MGBENCH_NUM_NODES", "1") != "1":
            out.update(multi_node_record(self))
        return out

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def multi_node_record(ranks: Ranks) -> dict[str, Any]:
    """Where each rank of a multi-node run ran, gathered over the process group itself
    (all_gather_object of every rank's node_identity), and what torch.distributed says of the
    group: `nodes` (one entry per node, its ranks) and `multi_node`."""
    out: list[Any] = [None] * ranks.world
    dist.all_gather_object(out, {**node_identity(), "rank": dist.get_rank(),
                                 "local_rank": ranks.local_rank,
                                 "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", 0)),
                                 "group_rank": int(os.environ.get("GROUP_RANK", -1))})
    nodes: dict[str, dict[str, Any]] = {}
    for row in out:
        node = nodes.setdefault(row["node"], {"node": row["node"], "host": row["host"],
                                              "slurm_procid": row["slurm_procid"], "ranks": []})
        node["ranks"].append(row["rank"])
    return {"nodes": list(nodes.values()), "multi_node": {
        "mechanism": "torchrun, c10d rendezvous",
        "rendezvous": {k: os.environ.get(k) for k in (
            "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE")},
        "world_size": dist.get_world_size(), "backend": dist.get_backend(),
        "ranks": out}}


def framework_versions() -> dict[str, str]:
    return {"torch": torch.__version__, "numpy": np.__version__}


def choose_backend(spec: Spec, requested: str) -> str:
    """The process group backend for the run's devices; Unavailable if it cannot work here."""
    gpu = spec.device == "gpu"
    backend = ("nccl" if gpu else "gloo") if requested == "auto" else requested
    if backend == "nccl" and not gpu:
        raise Unavailable("backend nccl needs GPUs; CPU ranks communicate through gloo "
                          "(backend auto or gloo)")
    if backend == "nccl" and not dist.is_nccl_available():
        raise Unavailable(f"backend nccl: this PyTorch build ({torch.__version__}) has no NCCL")
    if backend == "gloo" and not dist.is_gloo_available():
        raise Unavailable(f"backend gloo: this PyTorch build ({torch.__version__}) has no gloo")
    return backend


def init_ranks(spec: Spec, backend: str) -> Ranks:
    """Join the torchrun process group and pick this rank's device (Unavailable if absent)."""
    if "LOCAL_RANK" not in os.environ:
        raise Unavailable("this runner needs torchrun (launcher torchrun) to start its ranks")
    n = spec.num_devices
    backend = choose_backend(spec, backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    if spec.device == "gpu":
        device = use_gpu(local_rank, spec.devices_per_node, "envs/torch-gpu.txt")
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    _KEEP_ALIVE.append(dist.group.WORLD)
    world = dist.get_world_size()
    if world != n:
        raise Invalid(f"torchrun started {world} ranks for a {n}-device run")
    if device.type == "cuda":
        devices = [{"name": torch.cuda.get_device_name(i), "kind": "GPU", "rank": i}
                   for i in range(world)]
    else:
        devices = [{"name": f"cpu (rank {i})", "kind": "virtual CPU device (gloo process)",
                    "rank": i} for i in range(world)]
    return Ranks(dist.get_rank(), local_rank, world, device, devices, backend)


def use_gpu(index: int, needed: int, gpu_env: str) -> torch.device:
    """GPU `index` as this rank's device, convolutions autotuned (the warm-up pays for it);
    Unavailable unless torch sees `needed` GPUs (`gpu_env`: the environment with CUDA)."""
    if not torch.cuda.is_available():
        raise Unavailable(f"device gpu: torch {torch.__version__} sees no CUDA GPU"
                          + ("" if torch.version.cuda else
                             f" (a CPU-only build: install {gpu_env})"))
    if torch.cuda.device_count() < needed:
        raise Unavailable(f"needs {needed} GPUs on this host; torch sees "
                          f"{torch.cuda.device_count()}")
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = True
    return device


def synchronize(ranks: DeviceRank) -> None:
    """Wait for the device's queued work (a no-op on CPUs, which run eagerly)."""
    if ranks.cuda:
        torch.cuda.synchronize(ranks.device)


def per_rank_batch(spec: Spec, ranks: DeviceRank) -> int:
    return spec.split_batch(ranks.world, "ranks")


def synthetic_slice(ranks: DeviceRank, shape: tuple[int, ...], classes: int, batch: int,
                    memory_format: torch.memory_format = torch.contiguous_format
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random (images, labels) slice, generated on its device once, seeded by rank."""
    gen = torch.Generator(device=ranks.device).manual_seed(1234 + ranks.rank)
    x = torch.randn((batch, *shape), generator=gen, device=ranks.device)
    y = torch.randint(0, classes, (batch,), generator=gen, device=ranks.device)
    return x.contiguous(memory_format=memory_format), y


def synthetic_tokens(ranks: DeviceRank, seq_len: int, vocab: int, batch: int,
                     dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random token slice, generated on its device once, seeded by rank: ids in
    [0, vocab) of shape (batch, seq_len + 1); (inputs ids[:, :-1], next-token targets
    ids[:, 1:]). int64: torch's index type, what a torch model's embedding expects."""
    gen = torch.Generator(device=ranks.device).manual_seed(1234 + ranks.rank)
    ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen, device=ranks.device)
    ids = ids.to(dtype)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


TOKENS_REAL = ("data real: the prepared datasets are images; a token model trains on synthetic "
               "tokens")


def rank_input(spec: Spec, ranks: DeviceRank, model_spec: ModelSpec, batch: int,
               shape: tuple[int, ...], channels_first: bool = True,
               memory_format: torch.memory_format = torch.contiguous_format,
               context: str | None = None, token_dtype: torch.dtype = torch.int64) -> Feed:
    """This rank's `batch` samples per step: for an image model of shape `shape`, its
    synthetic slice, or on real data its DistributedSampler share through the DataLoader
    (DALI on GPUs when installed), its workers started by `context` (None: the platform's
    default); for a token model its synthetic token slice (synthetic_tokens, ids of
    `token_dtype`; real data is Unavailable)."""
    if model_spec.input_kind == "tokens":
        if spec.data == "real":
            raise Unavailable(TOKENS_REAL)
        return SyntheticInput(*synthetic_tokens(ranks, model_spec.input_shape[0],
                                                model_spec.num_classes, batch, token_dtype))
    if spec.data != "real":
        return SyntheticInput(*synthetic_slice(ranks, shape, model_spec.num_classes, batch,
                                               memory_format))
    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
    return open_input(spec, data, model_spec.input_shape[0], batch, ranks.rank, ranks.world,
                      ranks.device, channels_first, memory_format, context)


class PlacementTracker:
    """What this rank's steps actually ran on, read from the tensors themselves: the rows and
    devices of every input batch the step fed to its model (`saw`, called with the tensor the
    model is given), and the devices of the model's parameters. `reset()` starts a window (the
    timed steps, or the equivalence step)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rows = 0
        self.batch_devices: set[str] = set()
        self.output_dtypes: set[torch.dtype] = set()  # what the forward computed its logits in

    def computed(self, logits: torch.Tensor) -> torch.Tensor:
        """Note the dtype the model's forward gave its logits in (the compute dtype, as
        autocast or a mixed-precision policy left it)."""
        self.output_dtypes.add(logits.dtype)
        return logits

    def reset(self) -> None:
        self.rows, self.batch_devices = 0, set()

    def saw(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += int(x.shape[0])
        self.batch_devices.add(str(x.device))
        return x

    def local(self, rank: int) -> dict[str, Any]:
        """This rank's row of the placement (`rank` as the process group numbers it)."""
        return {"rank": rank, "rows": self.rows, "batch_devices": sorted(self.batch_devices),
                "param_devices": sorted({str(p.device) for p in self.model.parameters()})}


def gather_placement(tracker: PlacementTracker, rank: int, world: int,
                     gather: Callable[[Any], list[Any]], source: str) -> dict[str, Any]:
    """Every rank's row gathered over the process group (`gather(obj)` returns each rank's
    obj in rank order): `placement` maps "rank<r>:<device>" to the rows rank r stepped on.
    `rank` and `world` are the framework's (dist.get_rank()/get_world_size(), hvd.rank()/
    size()); a rank whose batches and parameters are not on one device is Invalid."""
    rows = gather(tracker.local(rank))
    if len(rows) != world or [r["rank"] for r in rows] != list(range(world)):
        raise Invalid(f"placement gathered from ranks {[r['rank'] for r in rows]}, but the "
                      f"process group has {world}")
    placement: dict[str, int] = {}
    for row in rows:
        devices = set(row["batch_devices"]) | set(row["param_devices"])
        if len(devices) != 1:
            raise Invalid(f"rank {row['rank']}: batches on {row['batch_devices']}, parameters "
                          f"on {row['param_devices']}: not one device")
        placement[f"rank{row['rank']}:{devices.pop()}"] = row["rows"]
    return {"placement": placement, "placement_source": source, "placement_ranks": rows}


class StepCounter:
    """Counts applied optimizer steps through the optimizer's step hooks, so the count does not
    come from the loop that claims to have run them.

    A wrapping optimizer whose step() calls its base class's (Horovod's DistributedOptimizer)
    runs the hooks around both; a pre-hook arms the count and the first post-hook takes it, so
    a step counts once however deep the nesting. A step the GradScaler skips (inf/NaN
    gradients) runs no hook: the step function adds it to `skipped`."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.applied = 0
        self.skipped = 0
        self._armed = False
        self.optimizer = optimizer  # runners.memory.model_state_torch reads its state
        optimizer.register_step_pre_hook(self._arm)
        optimizer.register_step_post_hook(self._count)

    def _arm(self, *_: Any) -> None:
        self._armed = True

    def _count(self, *_: Any) -> None:
        if self._armed:
            self.applied += 1
            self._armed = False


def rank_table(ranks: DeviceRank, row: list[int]) -> list[list[int]]:
    """Every rank's `row` of ints (as long on every rank), in rank order: each rank writes its
    row into its own line of a table of zeros, and the ranks sum the table."""
    table = torch.zeros((ranks.world, len(row)), dtype=torch.int64, device=ranks.device)
    table[ranks.rank] = torch.tensor(row, dtype=torch.int64)
    return [[int(v) for v in line] for line in ranks.all_sum(table).tolist()]


def global_mean_losses(losses: list[float], ranks: DeviceRank) -> list[float]:
    """Each step's loss averaged over the ranks (equal slices): the global batch's mean loss."""
    t = torch.tensor(losses, dtype=torch.float64, device=ranks.device)
    return [float(v) / ranks.world for v in ranks.all_sum(t).tolist()]


def threads_record(ranks: DeviceRank, note: str) -> dict[str, Any]:
    """Intra-op threads of every rank and the processes they are, and why (`note`)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    table = rank_table(ranks, [torch.get_num_threads(), int(env) if env.isdigit() else -1,
                               os.getpid()])
    per_rank = [{"rank": i, "torch_threads": threads, "OMP_NUM_THREADS": omp if omp >= 0 else None}
                for i, (threads, omp, _) in enumerate(table)]
    return {"per_rank": per_rank, "cpu_count": cores(),
            "processes": len({pid for *_, pid in table}), "note": note}


def timed_steps(spec: Spec, ranks: DeviceRank, step: Callable[[], torch.Tensor],
                counter: StepCounter, tracker: PlacementTracker, feed: Feed) -> dict[str, Any]:
    """runners.common.timed_loop over `step` (one training step, returns this rank's loss;
    it shows `tracker` each batch it feeds), each step ended by synchronising the device and
    reading the loss. The record: the timed window, the global losses, every rank's steps
    (which must agree, and give the samples), the placement of the timed steps, the ranks'
    record and the input's; the input closed."""
    start: dict[str, int] = {}

    def on_start() -> None:
        start.update(applied=counter.applied, skipped=counter.skipped)
        tracker.reset()

    def sync(loss: torch.Tensor) -> float:
        synchronize(ranks)
        return loss.item()  # this rank's step, its gradient exchange included, has finished

    window = timed_loop(step, sync, spec.warmup_steps, spec.measure_steps, on_start)
    table = rank_table(ranks, [counter.applied - start["applied"],
                               counter.skipped - start["skipped"]])
    steps = [applied + skipped for applied, skipped in table]
    if len(set(steps)) != 1:
        raise Invalid(f"ranks disagree on the steps taken: {steps}")
    batch = per_rank_batch(spec, ranks)
    samples = sum(steps) * batch
    global_losses = global_mean_losses(window.losses, ranks)
    placement = ranks.placement(tracker)
    check_rows(placement["placement"], samples)
    result = {
        **placement,
        **window.timer.summary(spec.global_batch_size, samples),
        "first_loss": finite(global_losses[0]),
        "last_loss": finite(global_losses[-1]),
        "loss_kind": "global mean cross-entropy of each step's batch (ranks' means averaged)",
        "steps_per_rank": steps,
        "steps_skipped_by_grad_scaler": min(skipped for _, skipped in table),
        "batch_size_per_rank": batch,
        **ranks.record(),
        **feed.record(),
    }
    feed.close()
    return result


def check_rows(placement: dict[str, int], samples: int) -> None:
    """The rows the ranks stepped on add up to the samples their step counts imply."""
    if sum(placement.values()) != samples:
        raise Invalid(f"the ranks stepped on {placement} rows, {sum(placement.values())} in "
                      f"all, but their optimizer steps imply {samples} samples")


def autocast(ranks: DeviceRank, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The forward pass's autocast for a precision (fp32: none)."""
    if precision in ("fp32", "tf32"):
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(ranks.device.type, dtype=dtype)


def sgd_step(ranks: DeviceRank, precision: str, model: nn.Module,
             optimizer: torch.optim.Optimizer, feed: Feed, tracker: PlacementTracker,
             counter: StepCounter, scaler: torch.amp.GradScaler | None = None,
             cast: bool = True) -> Step:
    """One training step of the torchrun runners: gradients cleared (set to None), the batch
    from `feed` through `model` under the run's autocast (`cast`; False where a
    mixed-precision policy casts instead), the loss (loss_of), backward, optimizer.step()
    (through `scaler` in fp16, a step it skips counted); it returns this rank's loss."""

    def step() -> torch.Tensor:
        x, y = feed.next()
        optimizer.zero_grad(set_to_none=True)
        with autocast(ranks, precision) if cast else contextlib.nullcontext():
            loss = loss_of(tracker.computed(model(tracker.saw(x))), y)
        backward_and_step(loss, optimizer, scaler, counter)
        return loss.detach()

    return step


def check_precision(spec: Spec, ranks: DeviceRank) -> None:
    precision = spec.precision
    if precision == "fp16" and not ranks.cuda:
        raise Unavailable("fp16 on CPU: float16 autocast with a GradScaler is for GPUs (the "
                          "CPU has no fast float16 convolutions); use bf16 on CPUs")
    if precision == "bf16" and ranks.cuda and not torch.cuda.is_bf16_supported():
        raise Unavailable(f"bf16: {torch.cuda.get_device_name(ranks.device)} has no bfloat16")


def wrap_ddp(model: nn.Module, ranks: DeviceRank, gradient_as_bucket_view: bool = False
             ) -> DDP:
    """The model in DDP (its defaults: 25 MB buckets, buffers broadcast from rank 0; with
    `gradient_as_bucket_view` the gradients are views into the all-reduce buckets)."""
    return DDP(model, device_ids=[ranks.local_rank] if ranks.cuda else None,
               gradient_as_bucket_view=gradient_as_bucket_view)


def nchw(model_spec: ModelSpec) -> tuple[int, int, int]:
    """An image model's (C, H, W) input; () for a token model (its input is (seq_len,))."""
    if model_spec.input_kind == "tokens":
        return ()  # type: ignore[return-value]
    h, w, c = model_spec.input_shape
    return (c, h, w)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy on float32 logits: over the batch for class logits (batch, classes),
    over every position for next-token logits (batch, seq, vocab) and targets (batch, seq)."""
    if logits.dim() == 3:
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten().long())
    return F.cross_entropy(logits.float(), targets)


def model_record(net: nn.Module, model_spec: ModelSpec) -> dict[str, Any]:
    """The run's torch model's fields (models.model_fields): a built-in CNN's FLOPs counted
    over its Conv2d and Linear layers (count_flops_torch), a built-in transformer's the spec's
    standard count, a user's model's by torch's FlopCounterMode (models.torch_common.describe;
    `net.described` when rank_model already counted them)."""
    return model_fields(model_spec, lambda: count_params_torch(net),
                        lambda: count_flops_torch(net, nchw(model_spec)),
                        lambda: getattr(net, "described", None) or describe(net, model_spec))


def build_model(spec: Spec, model_spec: ModelSpec, layout: str, device: torch.device
                ) -> nn.Module:
    """The run's torch model (models.build_for) on `device`: a built-in in `layout`, a user's
    model moved to that memory format (channels_last for an image model), checked to be an
    nn.Module whose output is the entry's logits; its description (models.torch_common.
    describe) kept as `described`. A user's model that is wrong is Invalid, saying why."""
    try:
        net = build_for(spec, "torch", data_format=layout)
        if spec.custom_model:
            if not isinstance(net, nn.Module):
                raise not_a_model(spec.custom_model, net, "a torch.nn.Module")
            if layout == "channels_last" and model_spec.input_kind == "image":
                net = net.to(memory_format=torch.channels_last)
            net = net.to(device)
            described = describe(net, model_spec)
            check_output(spec.custom_model, model_spec, tuple(described["output_shape"]), 2)
            net.described = described
    except CustomModelError as exc:
        raise Invalid(str(exc)) from None
    return net.to(device)


def rank_model(spec: Spec, ranks: DeviceRank, layout: str = "channels_first",
               context: str | None = None) -> tuple[ModelSpec, Feed, nn.Module]:
    """(the run's model spec (a built-in's, or a user's entry's: models.spec_of), this rank's
    input (rank_input: its synthetic slice or its share of the real data, workers started by
    `context`; token ids for a token model), the torch model (build_model) on the rank's
    device in `layout`, its initial weights seeded alike on every rank)."""
    model_spec = spec_of(spec)
    feed = rank_input(spec, ranks, model_spec, per_rank_batch(spec, ranks), nchw(model_spec),
                      memory_format=MEMORY_FORMATS[layout], context=context)
    torch.manual_seed(0)  # the same initial weights everywhere (DDP, Horovod broadcast anyway)
    net = build_model(spec, model_spec, layout, ranks.device)
    return model_spec, feed, net


def probe_equivalence(spec: Spec, ranks: DeviceRank,
                      make_step: Callable[[nn.Module, Feed, float],
                                          tuple[Step, StepCounter, PlacementTracker]],
                      layout: str = "channels_first",
                      whole: Callable[[nn.Module], nn.Module] = lambda net: net,
                      **own: Any) -> dict[str, Any]:
    """The equivalence mode over a runner's step function: the probe model at the given
    canonical weights on the rank's device (`layout`), its slice of the batch resident there
    (equivalence_input), `make_step(net, feed, learning_rate)` (plain SGD) called once by
    equivalence_step; rank 0 saves the weights of `whole(net)` (a sharded strategy's: a plain
    copy with the full weights, gathered by every rank); the ranks closed."""
    from models.torch_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = spec.equivalence_inputs()
    feed = equivalence_input(x, y, ranks, True, MEMORY_FORMATS[layout])
    net = load_builder("probe", "torch")(get_spec("probe"), data_format=layout)
    set_canonical_weights(net, weights)
    net = net.to(ranks.device)
    step, counter, tracker = make_step(net, feed, lr)
    return equivalence_step(spec, ranks, step, counter, tracker,
                            lambda: get_canonical_weights(whole(net)),
                            framework=framework_versions(), layout=layout, **own)


def equivalence_input(x: np.ndarray, y: np.ndarray, ranks: DeviceRank, channels_first: bool,
                      memory_format: torch.memory_format = torch.contiguous_format
                      ) -> SyntheticInput:
    """This rank's slice of the equivalence batch (given NHWC) as the benchmark's synthetic
    input: resident on the rank's device, in the run's layout and memory format."""
    per = rows_per_device(len(x), ranks.world, "ranks", "equivalence batch")
    part = slice(ranks.rank * per, (ranks.rank + 1) * per)
    images = x[part].transpose(0, 3, 1, 2) if channels_first else x[part]
    xs = torch.from_numpy(np.ascontiguousarray(images)).to(ranks.device)
    ys = torch.from_numpy(y[part].astype(np.int64)).to(ranks.device)
    return SyntheticInput(xs.contiguous(memory_format=memory_format), ys)


def equivalence_step(spec: Spec, ranks: DeviceRank, step: Callable[[], torch.Tensor],
                     counter: StepCounter, tracker: PlacementTracker,
                     canonical: Callable[[], dict[str, np.ndarray]], **own: Any
                     ) -> dict[str, Any]:
    """One call of the benchmark's `step`, counted by the optimizer's hooks on every rank;
    every rank reads the canonical weights, rank 0 saves them; the result (the step's
    placement, the global loss, the ranks' record, the runner's `own` fields); the ranks
    closed."""
    tracker.reset()
    applied0 = counter.applied
    loss = step()
    synchronize(ranks)
    steps = [applied for applied, in rank_table(ranks, [counter.applied - applied0])]
    if steps != [1] * ranks.world:
        raise Invalid(f"the equivalence step applied {steps} optimizer steps per rank, not 1")
    global_loss = finite(global_mean_losses([loss.item()], ranks)[0])
    placement = ranks.placement(tracker)
    weights = canonical()  # on every rank: a sharded strategy gathers its weights collectively
    if ranks.rank == 0:
        spec.save_equivalence_output(weights)
    result = {**placement, **ranks.record(), "loss": global_loss, **own}
    ranks.close()
    return result


# Mode converge (runners/converge.py) over a DeviceRank: the recipe's batches through a runner's
# own step, evaluation on rank 0 shared with the others, BatchNorm statistics of every rank.

EVAL_BATCH = 500  # held-out images per inference call


def converge_splits(spec: Spec, model_spec: ModelSpec) -> Any:
    """The run's dataset's splits, checked against the model (runners.converge.fitting_splits)."""
    from runners.converge import fitting_splits

    return fitting_splits(spec, model_spec)


def rank_shares(rows: int, world: int) -> list[int]:
    """The rows each rank takes of a global batch of `rows` (runners.converge.epoch_batches:
    numpy.array_split's shares, equal where `world` divides it)."""
    return [len(s) for s in np.array_split(np.arange(rows), world)]


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                      scaler: torch.amp.GradScaler | None, counter: StepCounter) -> None:
    """Backward and one optimizer step, through fp16's GradScaler when there is one (a step it
    skips is counted: the scaler backs off after a skip)."""
    if scaler is None:
        loss.backward()
        optimizer.step()
        return
    scale = scaler.get_scale()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    counter.skipped += scaler.get_scale() < scale


class ConvergeLoop:
    """train_epoch, evaluate and moving_stats (runners.converge.train_to_accuracy's) of a
    process-per-device runner, over its own training step's parts:

    - `forward(x) -> logits`: the runner's training model (DDP, compiled where it says so) in
      training mode, given this rank's share of the global batch as `to_input` made it on the
      rank's device from the Batch's NHWC float32 pixels;
    - the optimizer (its learning rate set to lr_at(step) in every param group before each
      step; StepCounter counts the steps applied), `scaler` (fp16's GradScaler) or None, the
      run's autocast around the forward when `cast`;
    - `infer(x) -> logits`: the same model in inference mode (BatchNorm's moving statistics),
      on rank 0 only, outside DDP (no collective), its accuracy shared with every rank through
      an all-sum (rank 0's figure, zeros elsewhere), so every rank takes the same decision;
    - `bn_stats() -> [(name, tensor)]`: every BatchNorm moving mean and variance the model
      holds, read on every rank (DDP's buffers are rank 0's only at each forward's start;
      Keras' moving statistics are never broadcast) and gathered.

    Loss: each rank's summed cross-entropy (float32 logits) x world / the global batch's rows,
    so DDP's mean of the ranks' gradients is the gradient of the global batch's mean loss even
    where the shares are unequal (last_batch keep); equal shares make it the mean over the
    rank's slice, the benchmark's loss. The epoch's loss is the mean over its steps of the
    global batches' mean losses (one all-sum per epoch)."""

    def __init__(self, ranks: DeviceRank, precision: str, forward: Callable[[torch.Tensor],
                 torch.Tensor], infer: Callable[[torch.Tensor], torch.Tensor],
                 to_input: Callable[[np.ndarray], torch.Tensor], counter: StepCounter,
                 tracker: PlacementTracker,
                 bn_stats: Callable[[], list[tuple[str, torch.Tensor]]],
                 scaler: torch.amp.GradScaler | None = None, cast: bool = True) -> None:
        self.ranks, self.precision, self.forward, self.infer = ranks, precision, forward, infer
        self.to_input, self.counter, self.tracker = to_input, counter, tracker
        self.bn_stats, self.scaler, self.cast = bn_stats, scaler, cast
        self.optimizer = counter.optimizer
        self.steps = 0  # the steps this rank took (applied or skipped by the GradScaler)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.ranks, self.precision) if self.cast else contextlib.nullcontext()

    def _labels(self, y: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(y.astype(np.int64)).to(self.ranks.device)

    def train_epoch(self, epoch: int, batches: list[Any], lr_at: Callable[[int], float]
                    ) -> float:
        ranks, optimizer, scaler = self.ranks, self.optimizer, self.scaler
        losses = []
        for i, b in enumerate(batches):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(i)
            x, y = self.to_input(b.x), self._labels(b.y)
            optimizer.zero_grad(set_to_none=True)
            with self._autocast():
                logits = self.tracker.computed(self.forward(self.tracker.saw(x)))
            loss = F.cross_entropy(logits.float(), y, reduction="sum") \
                * (ranks.world / b.global_rows)
            backward_and_step(loss, optimizer, scaler, self.counter)
            losses.append(loss.detach().double())
            self.steps += 1
        if not losses:
            return float("nan")
        per_step = ranks.all_sum(torch.stack(losses)) / ranks.world  # waits for the steps
        return float(per_step.mean().item())

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        ranks = self.ranks
        accuracy = torch.zeros((), dtype=torch.float64, device=ranks.device)
        if ranks.rank == 0:
            correct = 0
            with torch.no_grad(), self._autocast():
                for i in range(0, len(y), EVAL_BATCH):
                    logits = self.infer(self.to_input(x[i:i + EVAL_BATCH]))
                    predicted = logits.float().argmax(dim=1).cpu().numpy()
                    correct += int((predicted == y[i:i + EVAL_BATCH]).sum())
            accuracy.fill_(correct / len(y))
        return float(ranks.all_sum(accuracy).item())

    def moving_stats(self) -> tuple[bool, str]:
        stats = self.bn_stats()
        bad = next((name for name, t in stats if not bool(torch.isfinite(t).all())), None)
        rows = self.ranks.gather(bad)
        worst = [f"rank {r}: {name}" for r, name in enumerate(rows) if name is not None]
        if worst:
            return False, "; ".join(worst)
        return True, (f"{len(stats)} moving means and variances finite on each of "
                      f"{self.ranks.world} rank(s)")

    def record(self, samples: int) -> dict[str, Any]:
        """After the last epoch, on every rank: the placement of every training step (each
        rank's rows over the run, which must add up to the samples the epochs' global batches
        hold), the steps each rank took (which must agree), the ranks' record."""
        table = rank_table(self.ranks, [self.steps, self.counter.applied, self.counter.skipped])
        steps = [s for s, _, _ in table]
        if len(set(steps)) != 1 or any(a + k != s for s, a, k in table):
            raise Invalid(f"ranks' steps taken / applied / skipped disagree: {table}")
        placement = self.ranks.placement(self.tracker)
        check_rows(placement["placement"], samples)
        return {**placement, "steps_per_rank": steps,
                "steps_skipped_by_grad_scaler": min(k for *_, k in table),
                "loss_kind": "global mean cross-entropy of each step's batch (each rank's "
                             "summed cross-entropy x world / the global batch's rows; DDP "
                             "averages the ranks' gradients)",
                **self.ranks.record()}


def torch_bn_stats(net: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Every torch BatchNorm layer's running_mean and running_var, named."""
    out = []
    for name, module in net.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats:
            out += [(f"{name}.running_mean", module.running_mean),
                    (f"{name}.running_var", module.running_var)]
    return out
