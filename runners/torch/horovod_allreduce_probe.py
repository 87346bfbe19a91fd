"""The Horovod all-reduce probe (mode allreduce, issue 17): Horovod's in-place all-reduce of
PyTorch tensors, one process (rank) per device as horovodrun starts them.

Processes: horovodrun -np N --gloo (bench/launch.child_command, the horovod runner's launch);
each rank calls hvd.init() and drives one device (runners/torch/horovod.init_ranks: cuda:
hvd.local_rank() on GPUs, the CPU on CPU, where N gloo processes share the host's cores). The
all-reduce: `hvd.allreduce_(buffer, op=hvd.Sum, name=...)` of a float32 tensor on the rank's
device: hvd.allreduce's in-place form, the collective DistributedOptimizer issues per gradient
(there as allreduce_async_, in place on the gradient, with op Average, under the name
"allreduce.<parameter>", and synchronize() in step()). Horovod's background thread negotiates
the named tensor with the other ranks (the controller: gloo under horovodrun --gloo), then runs
the reduction with its CPU operations (gloo's ring all-reduce) on CPU tensors, or NCCL on GPU
tensors in a build with HOROVOD_GPU_OPERATIONS=NCCL. The name is the same at every iteration
of a size, as a gradient's is at every step, so Horovod's response cache answers the
negotiation as it does in training. hvd.allreduce_ is synchronous (allreduce_async_ +
synchronize): a call returns once this rank's result is complete. The timed buffer holds
zeros, so the repeated in-place sums stay 0.
Timing: contract/collectives.measure_size: warm-up calls, hvd.barrier() so the ranks start the
clock together, iterations back to back, then torch.cuda.synchronize on GPUs; each rank times
its own mean and the figure is the mean over the ranks (nccl-tests' default, -a 1:
hvd.allreduce of the time with op Average), so every rank has the same and rank 0 writes it.
Check: a buffer of the size filled with rank + 1 on rank r, one all-reduce, every element
n(n+1)/2 on every rank (each rank's verdict combined with hvd.allreduce, op Min).
Evidence (read back from Horovod): replicas and world_size = hvd.size(), devices = each
rank's hvd.rank() and its buffer's device ("rank1:cpu", gathered with hvd.allgather_object),
hvd.local_size(), the controller (hvd.gloo_enabled() / hvd.mpi_enabled()), what the build has
(gloo, MPI, NCCL), and the activities Horovod's own timeline recorded for one all-reduce
(HOROVOD_TIMELINE=DYNAMIC, recorded on rank 0 around the last size's check only: e.g.
GLOO_ALLREDUCE on CPU, NCCL_ALLREDUCE on GPUs).

All-gather and reduce-scatter (issue 27), same sizes, S as nccl-tests defines it
(contract/collectives.collective_bytes): `hvd.allgather(part, name=...)` concatenates every
rank's S/n-byte part along the first dimension (checked: rank r's part, r + 1, at position r on
every rank), and `hvd.reducescatter(buffer, op=hvd.Sum, name=...)` sums the ranks' S-byte
inputs and gives each rank its S/n part (checked: n(n+1)/2). Both return new tensors (Horovod
has no in-place form of either) and are synchronous, like hvd.allreduce_. Neither is what
DistributedOptimizer issues (it all-reduces); they are the collectives a sharded strategy
would ask of Horovod, measured so `predict` can price one on Horovod's links.

Follows Horovod 0.28.1's PyTorch API (horovod.torch.allreduce_, the collective under its
DistributedOptimizer). Differs from what a user ran: one tensor per call instead of a step's
gradients (DistributedOptimizer starts every gradient's all-reduce asynchronously as backward
produces it and Horovod fuses the ready ones into a fusion buffer, HOROVOD_FUSION_THRESHOLD
64 MB, before one all-reduce; here one tensor of each size is reduced alone and waited for),
op Sum instead of Average (the same reduction; Average divides after it), no compute beside it
to overlap with, and the probe's buffer sizes. One node only (horovod_launch's multi-node
launch is not used by this probe).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from runners.common import Invalid, Spec, Unavailable, main
from runners.torch.dist import threads_record
from runners.torch.horovod import THREADS_NOTE, controller, framework_versions, horovod, init_ranks

# Horovod reads this at hvd.init(): timelines can then be started and stopped at run time
# (hvd.start_timeline); nothing is recorded until one is started.
os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")


def timeline_activities(path: Path) -> list[str]:
    """The activity names of a Horovod timeline (Chrome trace JSON; Horovod may leave the
    closing bracket off): the phases one all-reduce went through, in first-seen order."""
    text = path.read_text().strip() if path.exists() else ""
    if not text:
        return []
    if not text.endswith("]"):
        text = text.rstrip(",") + "]"
    try:
        events = json.loads(text)
    except json.JSONDecodeError:
        return []
    names = [e.get("name") for e in events if isinstance(e, dict) and e.get("ph") == "B"]
    return list(dict.fromkeys(n for n in names if n and not n.startswith("allreduce.")))


def reduction_activity(activities: list[str]) -> str | None:
    """The timeline activity of the reduction itself (GLOO_ALLREDUCE, NCCL_ALLREDUCE,
    MPI_ALLREDUCE, ...): not the negotiation, not the enclosing ALLREDUCE."""
    return next((a for a in activities
                 if a.endswith("_ALLREDUCE") and not a.startswith("NEGOTIATE")), None)


def start_timeline(hvd: Any, path: Path) -> bool:
    """Start recording Horovod's timeline into `path`; False where Horovod refuses (the
    environment set HOROVOD_TIMELINE to something other than DYNAMIC before this module)."""
    try:
        hvd.start_timeline(str(path))
    except ValueError as exc:
        print(f"[probe] no timeline: {exc}", flush=True)
        return False
    return True


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.num_nodes > 1:
        raise Unavailable("the Horovod all-reduce probe runs on one node (horovodrun's "
                          "local gloo launch); across nodes it is not built")
    hvd = horovod()
    ranks = init_ranks(spec)  # hvd.init(), the rank's device; Invalid unless hvd.size() == N
    n, device = hvd.size(), ranks.device
    expected = expected_sum(n)

    def sync(out: torch.Tensor) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def across_ranks(seconds: float) -> float:
        """The mean of the ranks' mean times (nccl-tests' -a 1), through Horovod."""
        t = torch.tensor([seconds], dtype=torch.float64)
        return float(hvd.allreduce(t, op=hvd.Average, name="probe.time").item())

    rows: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}
    scratch = tempfile.TemporaryDirectory(prefix="hvd-timeline-")
    timeline = Path(scratch.name) / "timeline.json"
    sizes = probe_sizes(spec.model)
    start = time.time()
    for nbytes in sizes:
        elements = nbytes // DTYPE_BYTES
        buffer = torch.zeros(elements, dtype=torch.float32, device=device)  # sums stay 0
        name = f"allreduce.probe.{nbytes}"

        def allreduce(buffer: torch.Tensor = buffer, name: str = name) -> torch.Tensor:
            return hvd.allreduce_(buffer, op=hvd.Sum, name=name)

        def check(elements: int = elements, name: str = name,
                  last: bool = nbytes == sizes[-1]) -> bool:
            probe = torch.full((elements,), float(hvd.rank() + 1), dtype=torch.float32,
                               device=device)
            record = last and hvd.rank() == 0 and start_timeline(hvd, timeline)
            out = hvd.allreduce_(probe, op=hvd.Sum, name=name)
            sync(out)
            if record:
                hvd.stop_timeline()
            ok = bool(torch.all(out == expected).item())
            seen["device"] = str(out.device)
            verdict = torch.tensor([int(ok)], dtype=torch.int32)
            return bool(hvd.allreduce(verdict, op=hvd.Min, name="probe.check").item())

        rows.append(measure_size(nbytes, n, allreduce, sync, spec.warmup_steps,
                                 spec.measure_steps, across_ranks=across_ranks, check=check,
                                 barrier=hvd.barrier))

    def verdict(ok: bool, name: str) -> bool:
        flag = torch.tensor([int(ok)], dtype=torch.int32)
        return bool(hvd.allreduce(flag, op=hvd.Min, name=name).item())

    def measure_all_gather(nbytes: int) -> dict[str, Any]:
        part = nbytes // DTYPE_BYTES // n
        src = torch.zeros(part, dtype=torch.float32, device=device)
        want = torch.tensor(ar.expected_gather(n), dtype=torch.float32,
                            device=device).repeat_interleave(part)
        name = f"allgather.probe.{nbytes}"

        def check() -> bool:
            mine = torch.full((part,), float(hvd.rank() + 1), dtype=torch.float32,
                              device=device)
            got = hvd.allgather(mine, name=name)
            sync(got)
            return verdict(bool(torch.equal(got, want)), "probe.check.allgather")

        return measure_size(nbytes, n, lambda: hvd.allgather(src, name=name), sync,
                            spec.warmup_steps, spec.measure_steps, across_ranks=across_ranks,
                            check=check, barrier=hvd.barrier, collective=ar.ALL_GATHER)

    def measure_reduce_scatter(nbytes: int) -> dict[str, Any]:
        part = nbytes // DTYPE_BYTES // n
        src = torch.zeros(part * n, dtype=torch.float32, device=device)
        name = f"reducescatter.probe.{nbytes}"

        def check() -> bool:
            mine = torch.full((part * n,), float(hvd.rank() + 1), dtype=torch.float32,
                              device=device)
            got = hvd.reducescatter(mine, op=hvd.Sum, name=name)
            sync(got)
            ok = got.numel() == part and bool(torch.all(got == expected).item())
            return verdict(ok, "probe.check.reducescatter")

        return measure_size(nbytes, n, lambda: hvd.reducescatter(src, op=hvd.Sum, name=name),
                            sync, spec.warmup_steps, spec.measure_steps,
                            across_ranks=across_ranks, check=check, barrier=hvd.barrier,
                            collective=ar.REDUCE_SCATTER)

    collectives = {
        ar.ALL_GATHER: ar.measure_collective(ar.ALL_GATHER, spec.model, n, measure_all_gather,
                                       f"hvd.allgather, {controller()} controller"),
        ar.REDUCE_SCATTER: ar.measure_collective(ar.REDUCE_SCATTER, spec.model, n,
                                           measure_reduce_scatter,
                                           f"hvd.reducescatter (sum), {controller()} "
                                           "controller"),
    }
    window = (start, time.time())
    rank_devices = hvd.allgather_object({"rank": hvd.rank(), "local_rank": hvd.local_rank(),
                                         "buffer_device": seen["device"]})
    if [r["rank"] for r in rank_devices] != list(range(n)):
        raise Invalid(f"hvd.allgather_object answered ranks {[r['rank'] for r in rank_devices]}"
                      f" for hvd.size()={n}")
    activities = timeline_activities(timeline) if hvd.rank() == 0 else []
    scratch.cleanup()
    evidence = {
        "replicas": n,
        "world_size": n,
        "devices": [f"rank{r['rank']}:{r['buffer_device']}" for r in rank_devices],
        "local_size": hvd.local_size(),
        "controller": controller(),
        "gloo_enabled": hvd.gloo_enabled(), "mpi_enabled": hvd.mpi_enabled(),
        "gloo_built": hvd.gloo_built(), "mpi_built": hvd.mpi_built(),
        "nccl_built": bool(hvd.nccl_built()),
        "ranks": rank_devices,
        "timeline_activities": activities,
        "operation": reduction_activity(activities),
        "source": "replicas: hvd.size(); devices: each rank's hvd.rank() and its buffer's "
                  "device, gathered with hvd.allgather_object; hvd.local_size(), "
                  "hvd.gloo_enabled()/mpi_enabled() (the controller), hvd.*_built(); "
                  "activities of Horovod's timeline (rank 0) for the last size's check",
    }
    result = probe_result(rows, spec.model,
                          f"hvd.allreduce_ (sum), {controller()} controller"
                          + (f", {evidence['operation']}" if evidence["operation"] else ""),
                          evidence, framework_versions(), window=window,
                          collectives=collectives, devices=ranks.devices,
                          rank_threads=threads_record(ranks, THREADS_NOTE))
    ranks.close()
    return result


if __name__ == "__main__":
    main(benchmark)
