"""The all-reduce probe of PyTorch (mode: allreduce, probe torch_allreduce): torch.distributed's
own all_reduce (sum, float32, in place) over the torchrun process group, one process per
device: NCCL on GPUs, gloo on CPU (runners/torch/dist.py's init_ranks and choose_backend, as
torch_ddp). Each buffer size of contract.collectives.probe_sizes is timed as nccl-tests times it
(contract/collectives.py): warm-up, dist.barrier(), the timed all_reduce calls back to back, one
device synchronisation, each rank's mean time averaged over the ranks with an all_reduce.
The check of a size fills a buffer of it with rank + 1 and expects n(n+1)/2 in every element,
on every rank (the ranks' verdicts combined with a MIN all_reduce). The evidence is the
process group's own word: get_world_size(), get_backend(), and each rank's buffer device
gathered with all_gather_object.
All-gather and reduce-scatter (issue 27), over the same process group and sizes, S as
nccl-tests defines it (contract/collectives.collective_bytes): `dist.all_gather_into_tensor(out,
part)` of each rank's part of S/n bytes into an S-byte output (the call FSDP2 and ZeRO-3 gather
parameters with), checked by rank r's part being r + 1 at position r on every rank; and
`dist.reduce_scatter_tensor(out, inp)` of an S-byte input into each rank's S/n-byte part (the
call FSDP2 reduces gradients with), checked like the all-reduce (n(n+1)/2). A backend that
refuses one (an older gloo had no reduce_scatter) makes that collective unavailable with
torch's own message. Imports torch: child processes only.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from runners.common import Spec, main
from runners.torch.dist import (
    THREADS_NOTE,
    framework_versions,
    init_ranks,
    synchronize,
    threads_record,
)


def benchmark(spec: Spec) -> dict[str, Any]:
    ranks = init_ranks(spec, "auto")  # nccl on GPUs, gloo on CPU
    device = ranks.device
    world, backend = dist.get_world_size(), dist.get_backend()

    def mean_over_ranks(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return float(t.item()) / world

    def barrier() -> None:
        if ranks.cuda:
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()

    def all_ranks_agree(ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    rows = []
    start = time.time()
    for nbytes in probe_sizes(spec.model):
        elements = nbytes // DTYPE_BYTES
        buf = torch.zeros(elements, dtype=torch.float32, device=device)  # sums stay 0

        def check(elements: int = elements) -> bool:
            t = torch.full((elements,), float(ranks.rank + 1), dtype=torch.float32,
                           device=device)
            dist.all_reduce(t)
            synchronize(ranks)
            ok = bool(torch.all(t == expected_sum(world)).item())
            del t
            return all_ranks_agree(ok)

        def allreduce(buf: torch.Tensor = buf) -> torch.Tensor:
            dist.all_reduce(buf)
            return buf

        rows.append(measure_size(nbytes, world, allreduce, lambda _: synchronize(ranks),
                                 spec.warmup_steps, spec.measure_steps,
                                 across_ranks=mean_over_ranks, check=check, barrier=barrier))
        del buf

    def measure_sharded(nbytes: int, name: str) -> dict[str, Any]:
        """One row of all_gather_into_tensor (a part in, S out) or reduce_scatter_tensor (S in,
        a part out); the check's input is rank + 1 everywhere."""
        part = nbytes // DTYPE_BYTES // world
        gather = name == ar.ALL_GATHER
        size_in, size_out = (part, part * world) if gather else (part * world, part)
        call = dist.all_gather_into_tensor if gather else dist.reduce_scatter_tensor
        src = torch.zeros(size_in, dtype=torch.float32, device=device)
        out = torch.empty(size_out, dtype=torch.float32, device=device)
        want = (torch.tensor(ar.expected_gather(world), dtype=torch.float32, device=device)
                .repeat_interleave(part) if gather
                else torch.full((part,), expected_sum(world), device=device))

        def check() -> bool:
            got = torch.empty_like(out)
            call(got, torch.full((size_in,), float(ranks.rank + 1), dtype=torch.float32,
                                 device=device))
            synchronize(ranks)
            return all_ranks_agree(bool(torch.equal(got, want)))

        def collective() -> torch.Tensor:
            call(out, src)
            return out

        return measure_size(nbytes, world, collective, lambda _: synchronize(ranks),
                            spec.warmup_steps, spec.measure_steps, across_ranks=mean_over_ranks,
                            check=check, barrier=barrier, collective=name)

    collectives = {
        name: ar.measure_collective(name, spec.model, world,
                                    lambda nbytes, name=name: measure_sharded(nbytes, name),
                                    f"torch.distributed.{call} ({backend})")
        for name, call in ((ar.ALL_GATHER, "all_gather_into_tensor"),
                           (ar.REDUCE_SCATTER, "reduce_scatter_tensor"))
    }
    end = time.time()
    devices: list[Any] = [None] * world
    dist.all_gather_object(devices, f"rank{dist.get_rank()}:{device}")
    evidence = {
        "replicas": world, "backend": backend, "devices": devices,
        "source": f"torch.distributed process group (get_world_size()={world}, "
                  f"get_backend()={backend}); each rank's buffer device gathered with "
                  "all_gather_object",
    }
    if ranks.cuda:
        evidence["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    threads = threads_record(ranks, THREADS_NOTE)
    result = probe_result(rows, spec.model, f"torch.distributed.all_reduce ({backend})",
                          evidence, framework_versions(), window=(start, end),
                          collectives=collectives, devices=ranks.devices, rank_threads=threads)
    ranks.close()
    return result


if __name__ == "__main__":
    main(benchmark)
