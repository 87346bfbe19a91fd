"""The PyTorch runners' ranks (torchrun's `Ranks`, Horovod's in horovod_ranks.py) and what every
runner does over them: model and input, step counter, timed steps, cross-rank checks, threads,
placement read back from the tensors. Imports torch: child processes only."""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from contract.reasons import code
from contract.result import join
from models import ModelSpec, build_for, model_fields, spec_of
from models.custom import CustomModelError, check_output, not_a_model
from models.torch_common import count_flops_torch, count_params_torch, describe
from runners import memory
from runners.common import Invalid, Spec, Unavailable, finite, node_identity, timed_loop
from runners.real_data import cores
from runners.torch.cross_entropy import loss_of
from runners.torch.data import LoaderConfig, Place, RealInput, SyntheticInput, rank_input

MEMORY_FORMATS = {"channels_first": torch.contiguous_format, "channels_last": torch.channels_last}
# The process group, referenced until os._exit so its destructor never runs (a gloo teardown
# deadlock otherwise: docs/runners/torch_ddp.md, "Teardown")
_KEEP_ALIVE: list[Any] = []
THREADS_NOTE = code("torch.torchrun_threads")
Feed = SyntheticInput | RealInput
Step = Callable[[], torch.Tensor]  # one training step on this rank; returns its loss


@dataclass(frozen=True)
class DeviceRank(ABC):
    """This process's place among the ranks and the device it drives, whatever started them
    (torchrun's Ranks below, Horovod's in horovod_ranks.py); every rank calls the framework's
    collectives in the same order."""

    rank: int
    local_rank: int
    world: int
    device: torch.device
    devices: list[dict[str, Any]]  # one entry per rank, for the record

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def place(self) -> Place:
        return Place(self.rank, self.world, self.device)

    @abstractmethod
    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (on this rank's device) summed over the ranks."""

    @abstractmethod
    def gather(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, through the framework's collective."""

    @abstractmethod
    def placement(self, tracker: PlacementTracker) -> dict[str, Any]:
        """gather_placement over the ranks, as the framework counts them."""

    @abstractmethod
    def record(self) -> dict[str, Any]:
        """What the result says of the ranks: replicas, devices, communication, threads."""

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
        """gather_placement over the process group, its backend and size checked."""
        backend, world = dist.get_backend(), dist.get_world_size()
        if backend != self.backend or world != self.world:
            raise Invalid(f"the process group is {backend} with {world} ranks; the run asked "
                          f"for {self.backend} with {self.world}")
        source = (f"torch.distributed process group (get_backend()={backend}, get_world_size()="
                  f"{world}); {code('torch.rank_rows_all_gather_object')}")
        return gather_placement(tracker, dist.get_rank(), world, self.gather, source)

    def record(self) -> dict[str, Any]:
        out = {"replicas": self.world, "devices": self.devices, "backend": self.backend,
               "rank_threads": threads_record(self, THREADS_NOTE)}
        return join(out, multi_node_record(self)) if multi_node() else out

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def multi_node_record(ranks: Ranks) -> dict[str, Any]:
    """`nodes` (each rank's node_identity gathered over the process group, by node) and
    `multi_node` (what torch.distributed says of the group) of a multi-node run."""
    out = ranks.gather({**node_identity(), "rank": dist.get_rank(),
                        "local_rank": ranks.local_rank,
                        "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", 0)),
                        "group_rank": int(os.environ.get("GROUP_RANK", -1))})
    return {"nodes": group_nodes(out), "multi_node": {
        "mechanism": "torchrun, c10d rendezvous",
        "rendezvous": {k: os.environ.get(k) for k in (
            "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "GROUP_WORLD_SIZE")},
        "world_size": dist.get_world_size(), "backend": dist.get_backend(),
        "ranks": out}}


def multi_node() -> bool:
    return os.environ.get("MGBENCH_NUM_NODES", "1") != "1"


def group_nodes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks' node_identity rows grouped by node, in first-seen order, each with its ranks."""
    nodes: dict[str, dict[str, Any]] = {}
    for row in rows:
        node = nodes.setdefault(row["node"], {"node": row["node"], "host": row["host"],
                                              "slurm_procid": row["slurm_procid"], "ranks": []})
        node["ranks"].append(row["rank"])
    return list(nodes.values())


def framework_versions(*extra: str) -> dict[str, str]:
    """Versions of torch, numpy and the named extra packages (keras, horovod, deepspeed)."""
    import importlib

    names = ("torch", "numpy", *extra)
    return {name: importlib.import_module(name).__version__ for name in names}


def nchw_fields(strategy: str) -> dict[str, Any]:
    """The versions, layout and strategy of a runner on channels_first torch models."""
    return {"framework": framework_versions(), "layout": "channels_first", "strategy": strategy}


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


def init_ranks(spec: Spec, backend: str, check: bool = False) -> Ranks:
    """Join the torchrun process group and pick this rank's device (Unavailable if absent);
    when `check`, the run's precision checked on it (check_precision)."""
    if "LOCAL_RANK" not in os.environ:
        raise Unavailable("this runner needs torchrun (launcher torchrun) to start its ranks")
    n = spec.num_devices
    backend = choose_backend(spec, backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    device = (use_gpu(local_rank, spec.devices_per_node, "envs/torch-gpu.txt")
              if spec.device == "gpu" else torch.device("cpu"))
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    _KEEP_ALIVE.append(dist.group.WORLD)
    world = dist.get_world_size()
    if world != n:
        raise Invalid(f"torchrun started {world} ranks for a {n}-device run")
    devices = [{"name": torch.cuda.get_device_name(i), "kind": "GPU", "rank": i}
               if device.type == "cuda" else
               {"name": f"cpu (rank {i})", "kind": "virtual CPU device (gloo process)", "rank": i}
               for i in range(world)]
    ranks = Ranks(dist.get_rank(), local_rank, world, device, devices, backend)
    if check:
        check_precision(spec, ranks)
    memory.baseline(code("memory.baseline_torch_process_group"))
    return ranks


def use_gpu(index: int, needed: int, gpu_env: str) -> torch.device:
    """GPU `index`, convolutions autotuned; Unavailable unless torch sees `needed` GPUs."""
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


class PlacementTracker:
    """What this rank's steps ran on, read from the tensors: the rows and devices of every batch
    fed to the model (`saw`), its parameters' devices; `reset()` starts a window."""

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
    """Every rank's row gathered (`gather`, in rank order; `rank` and `world` as the framework
    counts them): `placement` maps "rank<r>:<device>" to the rows rank r stepped on; a rank
    whose batches and parameters are not on one device is Invalid."""
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
    """Applied optimizer steps, counted by the optimizer's own step hooks (not by the loop). A
    pre-hook arms and the first post-hook counts, so a wrapping optimizer's step (Horovod's)
    counts once; a step the GradScaler skips runs no hook: the step adds it to `skipped`."""

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
    """Every rank's `row` of ints in rank order (each writes its line of zeros; all-summed)."""
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
    """runners.common.timed_loop over `step` (it returns this rank's loss and shows `tracker`
    each batch), each step ended by synchronising and reading the loss. The record: the window,
    the global losses, every rank's steps (which must agree), the placement, the ranks' record
    and the input's; the input closed."""
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
    batch = spec.split_batch(ranks.world, "ranks")
    samples = sum(steps) * batch
    global_losses = global_mean_losses(window.losses, ranks)
    placement = ranks.placement(tracker)
    check_rows(placement["placement"], samples)
    result = join(placement, window.timer.summary(spec.global_batch_size, samples), {
        "first_loss": finite(global_losses[0]),
        "last_loss": finite(global_losses[-1]),
        "loss_kind": "global mean cross-entropy of each step's batch (ranks' means averaged)",
        "steps_per_rank": steps,
        "steps_skipped_by_grad_scaler": min(skipped for _, skipped in table),
        "batch_size_per_rank": batch,
    }, ranks.record(), feed.record())
    feed.close()
    return result


def closing(ranks: DeviceRank, *fields: dict[str, Any]) -> dict[str, Any]:
    """The result joined from `fields` (contract.result.join), then the ranks closed."""
    result = join(*fields)
    ranks.close()
    return result


def check_rows(placement: dict[str, int], samples: int) -> None:
    """The rows the ranks stepped on add up to the samples their step counts imply."""
    if sum(placement.values()) != samples:
        raise Invalid(f"the ranks stepped on {placement} rows, {sum(placement.values())} in "
                      f"all, but their optimizer steps imply {samples} samples")


def autocast(ranks: DeviceRank, precision: str, cast: bool = True
             ) -> contextlib.AbstractContextManager[Any]:
    """The forward pass's autocast for a precision (fp32, or not `cast`: none)."""
    if precision in ("fp32", "tf32") or not cast:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(ranks.device.type, dtype=dtype)


@dataclass
class StepParts:
    """A training step's parts: the model it calls (DDP, compiled, sharded), the counted
    optimizer, the tracker, fp16's scaler, whether the run's autocast wraps the forward, the
    loss of (logits, targets) sgd_step takes (loss_of: float32 cross-entropy; torch_ddp's
    option: cross_entropy.CrossEntropy)."""

    model: Callable[..., torch.Tensor]
    counter: StepCounter
    tracker: PlacementTracker
    scaler: Any = None
    cast: bool = True
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = loss_of

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.counter.optimizer


def train_on(ranks: DeviceRank, precision: str, parts: StepParts, x: torch.Tensor,
             loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Gradients set to None, `x` through the model under the autocast, `loss_fn(logits)`,
    backward and one optimizer step, through fp16's GradScaler if any (a skipped step
    counted); this rank's loss, detached."""
    optimizer, scaler = parts.optimizer, parts.scaler
    optimizer.zero_grad(set_to_none=True)
    with autocast(ranks, precision, parts.cast):
        loss = loss_fn(parts.tracker.computed(parts.model(parts.tracker.saw(x))))
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        parts.counter.skipped += scaler.get_scale() < scale
    return loss.detach()


def sgd_step(ranks: DeviceRank, precision: str, parts: StepParts, feed: Feed) -> Step:
    """One training step (train_on) on the batch from `feed`; it returns this rank's loss."""

    def step() -> torch.Tensor:
        x, y = feed.next()
        return train_on(ranks, precision, parts, x, lambda logits: parts.loss(logits, y))

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
    """The model in DDP (its defaults: 25 MB buckets, buffers broadcast from rank 0)."""
    return DDP(model, device_ids=[ranks.local_rank] if ranks.cuda else None,
               gradient_as_bucket_view=gradient_as_bucket_view)


def nchw(model_spec: ModelSpec) -> tuple[int, int, int]:
    """An image model's (C, H, W) input; () for a token model (its input is (seq_len,))."""
    if model_spec.input_kind == "tokens":
        return ()  # type: ignore[return-value]
    h, w, c = model_spec.input_shape
    return (c, h, w)


def model_record(net: nn.Module, model_spec: ModelSpec) -> dict[str, Any]:
    """The run's torch model's fields (models.model_fields): a CNN's FLOPs counted over its
    layers, a transformer's the spec's count, a user's model's by FlopCounterMode (describe)."""
    return model_fields(model_spec, lambda: count_params_torch(net),
                        lambda: count_flops_torch(net, nchw(model_spec)),
                        lambda: getattr(net, "described", None) or describe(net, model_spec))


def build_model(spec: Spec, model_spec: ModelSpec, layout: str, device: torch.device
                ) -> nn.Module:
    """The run's torch model (models.build_for) on `device` in `layout`; a user's model checked
    to be an nn.Module giving the entry's logits (Invalid, saying why), described (`described`)."""
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
    """(the run's model spec, this rank's input (rank_input; DataLoader workers started by
    `context`), the torch model (build_model) in `layout`, seeded alike on every rank)."""
    model_spec = spec_of(spec)
    feed = rank_input(spec, ranks.place, model_spec, nchw(model_spec),
                      LoaderConfig(memory_format=MEMORY_FORMATS[layout], context=context))
    torch.manual_seed(0)  # the same initial weights everywhere (DDP, Horovod broadcast anyway)
    net = build_model(spec, model_spec, layout, ranks.device)
    return model_spec, feed, net
