"""torch_allreduce: torch.distributed's all_reduce (sum, float32, in place), all_gather_into_tensor
and reduce_scatter_tensor over the torchrun process group, timed as nccl-tests times them
(contract/collectives.py), each size checked on every rank. docs/runners/torch_allreduce.md."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from runners.common import Spec, main
from runners.torch import dist as td


class Collectives:
    """The probe's calls over this rank's process group: one row of contract.collectives'
    measure_size per size and collective, with the barrier, the mean over the ranks and the
    check they share."""

    def __init__(self, spec: Spec, ranks: td.Ranks) -> None:
        self.spec, self.ranks, self.device = spec, ranks, ranks.device
        self.world = dist.get_world_size()

    def mean_over_ranks(self, seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def barrier(self) -> None:
        dist.barrier(device_ids=[self.device.index] if self.ranks.cuda else None)

    def all_ranks_agree(self, ok: bool) -> bool:
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def mine(self, elements: int) -> torch.Tensor:
        """A check's input: rank + 1 in every element."""
        return torch.full((elements,), float(self.ranks.rank + 1), dtype=torch.float32,
                          device=self.device)

    def measure(self, nbytes: int, call: Callable[[], torch.Tensor],
                check: Callable[[], bool], collective: str = ar.ALL_REDUCE) -> dict[str, Any]:
        return measure_size(nbytes, self.world, call, lambda _: td.synchronize(self.ranks),
                            self.spec.warmup_steps, self.spec.measure_steps,
                            ar.Around(check, self.barrier, self.mean_over_ranks),
                            collective=collective)

    def allreduce(self, nbytes: int) -> dict[str, Any]:
        """One row of the in-place all_reduce (the timed buffer holds zeros: sums stay 0)."""
        elements = nbytes // DTYPE_BYTES
        buf = torch.zeros(elements, dtype=torch.float32, device=self.device)

        def check() -> bool:
            t = self.mine(elements)
            dist.all_reduce(t)
            td.synchronize(self.ranks)
            ok = bool(torch.all(t == expected_sum(self.world)).item())
            del t
            return self.all_ranks_agree(ok)

        def allreduce() -> torch.Tensor:
            dist.all_reduce(buf)
            return buf

        return self.measure(nbytes, allreduce, check)

    def sharded(self, nbytes: int, name: str) -> dict[str, Any]:
        """One row of all_gather_into_tensor (a part in, S out) or reduce_scatter_tensor (S in,
        a part out); the check's input is rank + 1 everywhere."""
        world, device = self.world, self.device
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
            call(got, self.mine(size_in))
            td.synchronize(self.ranks)
            return self.all_ranks_agree(bool(torch.equal(got, want)))

        def collective() -> torch.Tensor:
            call(out, src)
            return out

        return self.measure(nbytes, collective, check, name)


def benchmark(spec: Spec) -> dict[str, Any]:
    ranks = td.init_ranks(spec, "auto")  # nccl on GPUs, gloo on CPU
    probe = Collectives(spec, ranks)
    world, backend = probe.world, dist.get_backend()
    start = time.time()
    rows = [probe.allreduce(nbytes) for nbytes in probe_sizes(spec.model)]
    collectives = {
        name: ar.measure_collective(name, spec.model, world,
                                    lambda nbytes, name=name: probe.sharded(nbytes, name),
                                    f"torch.distributed.{call} ({backend})")
        for name, call in ((ar.ALL_GATHER, "all_gather_into_tensor"),
                           (ar.REDUCE_SCATTER, "reduce_scatter_tensor"))
    }
    end = time.time()
    devices = ranks.gather(f"rank{dist.get_rank()}:{ranks.device}")
    evidence = {
        "replicas": world, "backend": backend, "devices": devices,
        "source": f"torch.distributed process group (get_world_size()={world}, "
                  f"get_backend()={backend}); each rank's buffer device gathered with "
                  "all_gather_object",
    }
    if ranks.cuda:
        evidence["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    result = probe_result(rows, spec.model, f"torch.distributed.all_reduce ({backend})",
                          evidence, td.framework_versions(), window=(start, end),
                          collectives=collectives, devices=ranks.devices,
                          rank_threads=td.threads_record(ranks, td.THREADS_NOTE))
    return td.closing(ranks, result)


if __name__ == "__main__":
    main(benchmark)
