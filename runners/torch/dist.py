"""torchrun ranks, shared by the PyTorch runners (torch_ddp, keras_torch): the process group,
each rank's device, its input (the synthetic slice, or its share of the real data through
runners/torch/data.py), the step counter, the timed loop, global losses and per-rank threads;
and, for them and horovod, the placement read back from the ranks (PlacementTracker,
gather_placement). Imports torch: child processes only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from models import ModelSpec
from runners.common import Invalid, Spec, StepTimer, Unavailable, finite, save_equivalence_output
from runners.real_data import check_classes, open_dataset
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


@dataclass(frozen=True)
class Ranks:
    """This process's place in the process group and the device it drives."""

    rank: int
    local_rank: int
    world: int
    device: torch.device
    backend: str
    devices: list[dict[str, Any]]  # one entry per rank, for the record

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


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


def init_ranks(spec: Spec, backend: str = "auto") -> Ranks:
    """Join the torchrun process group and pick this rank's device (Unavailable if absent)."""
    if "LOCAL_RANK" not in os.environ:
        raise Unavailable("this runner needs torchrun (launcher torchrun) to start its ranks")
    n = spec.num_devices
    backend = choose_backend(spec, backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    if spec.device == "gpu":
        if not torch.cuda.is_available():
            raise Unavailable(f"device gpu: torch {torch.__version__} sees no CUDA GPU"
                              + ("" if torch.version.cuda else
                                 " (a CPU-only build: install envs/torch-gpu.txt)"))
        if torch.cuda.device_count() < n:
            raise Unavailable(f"needs {n} GPUs; torch sees {torch.cuda.device_count()}")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True  # autotune convolutions (warm-up pays for it)
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
    return Ranks(dist.get_rank(), local_rank, world, device, backend, devices)


def close_ranks() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class DeviceRank(Protocol):
    """What the helpers below need of a rank: torchrun's Ranks here, Horovod's in horovod.py."""

    rank: int
    world: int
    device: torch.device

    @property
    def cuda(self) -> bool: ...


def synchronize(ranks: DeviceRank) -> None:
    """Wait for the device's queued work (a no-op on CPUs, which run eagerly)."""
    if ranks.cuda:
        torch.cuda.synchronize(ranks.device)


def per_rank_batch(spec: Spec, ranks: DeviceRank) -> int:
    global_batch = spec.global_batch_size
    if global_batch % ranks.world:
        raise Invalid(f"global batch {global_batch} does not divide by {ranks.world} ranks")
    return global_batch // ranks.world


def synthetic_slice(ranks: DeviceRank, shape: tuple[int, ...], classes: int, batch: int,
                    memory_format: torch.memory_format = torch.contiguous_format
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random (images, labels) slice, generated on its device once, seeded by rank."""
    gen = torch.Generator(device=ranks.device).manual_seed(1234 + ranks.rank)
    x = torch.randn((batch, *shape), generator=gen, device=ranks.device)
    y = torch.randint(0, classes, (batch,), generator=gen, device=ranks.device)
    return x.contiguous(memory_format=memory_format), y


def rank_input(spec: Spec, ranks: Ranks, model_spec: ModelSpec, batch: int,
               shape: tuple[int, int, int], channels_first: bool = True,
               memory_format: torch.memory_format = torch.contiguous_format
               ) -> SyntheticInput | RealInput:
    """This rank's `batch` images per step of shape `shape`: its synthetic slice, or on real
    data its DistributedSampler share through the DataLoader (DALI on GPUs when installed)."""
    if spec.data != "real":
        return SyntheticInput(*synthetic_slice(ranks, shape, model_spec.num_classes, batch,
                                               memory_format))
    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
    return open_input(spec, data, model_spec.input_shape[0], batch, ranks.rank, ranks.world,
                      ranks.device, channels_first, memory_format)


class PlacementTracker:
    """What this rank's steps actually ran on, read from the tensors themselves: the rows and
    devices of every input batch the step fed to its model (`saw`, called with the tensor the
    model is given), and the devices of the model's parameters. `reset()` starts a window (the
    timed steps, or the equivalence step)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.rows = 0
        self.batch_devices: set[str] = set()

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


def torch_placement(tracker: PlacementTracker, ranks: Ranks) -> dict[str, Any]:
    """gather_placement over the torch.distributed process group, whose backend and size are
    read back from it and checked against the run's."""
    backend, world = dist.get_backend(), dist.get_world_size()
    if backend != ranks.backend or world != ranks.world:
        raise Invalid(f"the process group is {backend} with {world} ranks; the run asked for "
                      f"{ranks.backend} with {ranks.world}")

    def gather(obj: Any) -> list[Any]:
        out: list[Any] = [None] * world
        dist.all_gather_object(out, obj)
        return out

    source = (f"torch.distributed process group (get_backend()={backend}, get_world_size()="
              f"{world}); each rank's input-batch rows and device and its parameters' device, "
              "read from the tensors it stepped on and gathered with all_gather_object")
    return gather_placement(tracker, dist.get_rank(), world, gather, source)


class StepCounter:
    """Counts optimizer.step() calls by the optimizer's post-step hook, not by the loop."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.applied = 0
        self.skipped = 0  # fp16 steps the GradScaler skipped (inf/NaN gradients)
        optimizer.register_step_post_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.applied += 1


def all_reduce_ints(values: list[int], ranks: Ranks, op: dist.ReduceOp) -> list[int]:
    t = torch.tensor(values, dtype=torch.int64, device=ranks.device)
    dist.all_reduce(t, op=op)
    return [int(v) for v in t.tolist()]


def global_mean_losses(losses: list[float], ranks: Ranks) -> list[float]:
    """Each step's loss averaged over the ranks (equal slices): the global batch's mean loss."""
    t = torch.tensor(losses, dtype=torch.float64, device=ranks.device)
    dist.all_reduce(t)
    return [float(v) / ranks.world for v in t.tolist()]


def threads_record(ranks: Ranks) -> dict[str, Any]:
    """Intra-op threads of every rank (one row each, summed over the ranks), and why."""
    omp = os.environ.get("OMP_NUM_THREADS", "")
    rows = [[0, 0] for _ in range(ranks.world)]
    rows[ranks.rank] = [torch.get_num_threads(), int(omp) if omp.isdigit() else -1]
    table = all_reduce_ints([v for row in rows for v in row], ranks, dist.ReduceOp.SUM)
    per_rank = [{"rank": i, "torch_threads": table[2 * i],
                 "OMP_NUM_THREADS": table[2 * i + 1] if table[2 * i + 1] >= 0 else None}
                for i in range(ranks.world)]
    return {"per_rank": per_rank, "cpu_count": os.cpu_count(), "note": THREADS_NOTE}


def timed_steps(spec: Spec, ranks: Ranks, step: Callable[[], torch.Tensor],
                counter: StepCounter, batch_per_rank: int, tracker: PlacementTracker
                ) -> dict[str, Any]:
    """Warm up, then time `step` (one training step, returns this rank's loss) as the record,
    with the placement of the timed steps (`step` shows `tracker` each batch it feeds)."""
    for _ in range(spec.warmup_steps):
        step().item()
    synchronize(ranks)
    applied0, skipped0 = counter.applied, counter.skipped
    tracker.reset()
    timer, losses = StepTimer(), []
    timer.start()
    for _ in range(spec.measure_steps):
        loss = step()
        synchronize(ranks)
        losses.append(loss.item())  # waits for this rank's step; DDP's all-reduce was in it
        timer.tick()
    if not losses:
        raise Invalid("measure_steps is 0: nothing was timed")
    steps = counter.applied - applied0 + counter.skipped - skipped0
    low, skipped = all_reduce_ints([steps, counter.skipped - skipped0], ranks, dist.ReduceOp.MIN)
    high, = all_reduce_ints([steps], ranks, dist.ReduceOp.MAX)
    if low != high:
        raise Invalid(f"ranks disagree on the steps taken: between {low} and {high}")
    samples, = all_reduce_ints([steps * batch_per_rank], ranks, dist.ReduceOp.SUM)
    global_losses = global_mean_losses(losses, ranks)
    placement = torch_placement(tracker, ranks)
    check_rows(placement["placement"], samples)
    return {
        **placement,
        **timer.summary(spec.global_batch_size, samples),
        "first_loss": finite(global_losses[0]),
        "last_loss": finite(global_losses[-1]),
        "loss_kind": "global mean cross-entropy of each step's batch (ranks' means averaged)",
        "steps_skipped_by_grad_scaler": skipped,
    }


def check_rows(placement: dict[str, int], samples: int) -> None:
    """The rows the ranks stepped on add up to the samples their step counts imply."""
    if sum(placement.values()) != samples:
        raise Invalid(f"the ranks stepped on {placement} rows, {sum(placement.values())} in "
                      f"all, but their optimizer steps imply {samples} samples")


def autocast(ranks: Ranks, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The forward pass's autocast for a precision (fp32: none)."""
    if precision in ("fp32", "tf32"):
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(ranks.device.type, dtype=dtype)


def check_precision(spec: Spec, ranks: Ranks) -> None:
    precision = spec.precision
    if precision == "fp16" and not ranks.cuda:
        raise Unavailable("fp16 on CPU: float16 autocast with a GradScaler is for GPUs (the "
                          "CPU has no fast float16 convolutions); use bf16 on CPUs")
    if precision == "bf16" and ranks.cuda and not torch.cuda.is_bf16_supported():
        raise Unavailable(f"bf16: {torch.cuda.get_device_name(ranks.device)} has no bfloat16")


def wrap_ddp(model: nn.Module, ranks: Ranks) -> DDP:
    """The model in DDP (its defaults: 25 MB buckets, buffers broadcast from rank 0)."""
    return DDP(model, device_ids=[ranks.local_rank] if ranks.cuda else None)


def nchw(model_spec: ModelSpec) -> tuple[int, int, int]:
    h, w, c = model_spec.input_shape
    return (c, h, w)


def equivalence_input(x: np.ndarray, y: np.ndarray, ranks: DeviceRank, channels_first: bool,
                      memory_format: torch.memory_format = torch.contiguous_format
                      ) -> SyntheticInput:
    """This rank's slice of the equivalence batch (given NHWC) as the benchmark's synthetic
    input: resident on the rank's device, in the run's layout and memory format."""
    if len(x) % ranks.world:
        raise Invalid(f"equivalence batch {len(x)} does not divide by {ranks.world} ranks")
    per = len(x) // ranks.world
    part = slice(ranks.rank * per, (ranks.rank + 1) * per)
    images = x[part].transpose(0, 3, 1, 2) if channels_first else x[part]
    xs = torch.from_numpy(np.ascontiguousarray(images)).to(ranks.device)
    ys = torch.from_numpy(y[part].astype(np.int64)).to(ranks.device)
    return SyntheticInput(xs.contiguous(memory_format=memory_format), ys)


def equivalence_step(spec: Spec, ranks: Ranks, step: Callable[[], torch.Tensor],
                     counter: StepCounter, tracker: PlacementTracker,
                     canonical: Callable[[], dict[str, np.ndarray]], layout: str
                     ) -> dict[str, Any]:
    """One call of the benchmark's `step`, counted by the optimizer's hook; rank 0 saves the
    canonical weights; the result with the step's placement; the group closed."""
    tracker.reset()
    applied0 = counter.applied
    loss = step()
    synchronize(ranks)
    steps, = all_reduce_ints([counter.applied - applied0], ranks, dist.ReduceOp.MIN)
    if steps != 1:
        raise Invalid(f"the equivalence step applied {steps} optimizer steps on some rank, "
                      "not 1")
    global_loss = finite(global_mean_losses([loss.item()], ranks)[0])
    placement = torch_placement(tracker, ranks)
    if ranks.rank == 0:
        save_equivalence_output(spec, canonical())
    result = {**placement, "replicas": ranks.world, "framework": framework_versions(),
              "devices": ranks.devices, "loss": global_loss, "backend": ranks.backend,
              "layout": layout}
    close_ranks()
    return result
