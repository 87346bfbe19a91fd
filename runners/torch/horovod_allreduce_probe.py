"""horovod_allreduce: Horovod 0.28.1's in-place hvd.allreduce_ (op Sum, one named tensor per size),
hvd.allgather and hvd.reducescatter of PyTorch tensors, one process per device, timed as
nccl-tests times them (contract/collectives.py) and checked per size. Differs from training: one
tensor per call (no fusion buffer), op Sum, nothing to overlap, one node only.
docs/runners/horovod_allreduce.md."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from contract.reasons import code
from runners.common import Invalid, Spec, Unavailable, main
from runners.torch.dist import closing, framework_versions, threads_record
from runners.torch.horovod_ranks import THREADS_NOTE, HorovodRanks, controller, horovod, init_ranks

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


def start_timeline(hvd: Any, path: Path) -> bool:
    """Start recording Horovod's timeline into `path`; False where Horovod refuses (the
    environment set HOROVOD_TIMELINE to something other than DYNAMIC before this module)."""
    try:
        hvd.start_timeline(str(path))
    except ValueError as exc:
        print(f"[probe] no timeline: {exc}", flush=True)
        return False
    return True


class Collectives:
    """The probe's Horovod calls on this rank: one row of contract.collectives' measure_size
    per size and collective, with the barrier, the mean over the ranks and the verdicts they
    share; the last all-reduce size's check records Horovod's timeline on rank 0."""

    def __init__(self, spec: Spec, ranks: HorovodRanks, timeline: Path) -> None:
        self.hvd, self.spec, self.device, self.timeline = horovod(), spec, ranks.device, timeline
        self.n = self.hvd.size()
        self.seen: dict[str, Any] = {}

    def sync(self, out: torch.Tensor) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def across_ranks(self, seconds: float) -> float:
        """The mean of the ranks' mean times (nccl-tests' -a 1), through Horovod."""
        t = torch.tensor([seconds], dtype=torch.float64)
        return float(self.hvd.allreduce(t, op=self.hvd.Average, name="probe.time").item())

    def verdict(self, ok: bool, name: str) -> bool:
        flag = torch.tensor([int(ok)], dtype=torch.int32)
        return bool(self.hvd.allreduce(flag, op=self.hvd.Min, name=name).item())

    def mine(self, elements: int) -> torch.Tensor:
        """A check's input: rank + 1 in every element."""
        return torch.full((elements,), float(self.hvd.rank() + 1), dtype=torch.float32,
                          device=self.device)

    def measure(self, nbytes: int, call: Callable[[], torch.Tensor],
                check: Callable[[], bool], collective: str = ar.ALL_REDUCE) -> dict[str, Any]:
        return measure_size(nbytes, self.n, call, self.sync, self.spec.warmup_steps,
                            self.spec.measure_steps,
                            ar.Around(check, self.hvd.barrier, self.across_ranks),
                            collective=collective)

    def allreduce(self, nbytes: int, last: bool) -> dict[str, Any]:
        hvd, elements = self.hvd, nbytes // DTYPE_BYTES
        buffer = torch.zeros(elements, dtype=torch.float32, device=self.device)  # sums stay 0
        name = f"allreduce.probe.{nbytes}"

        def check() -> bool:
            probe = self.mine(elements)
            record = last and hvd.rank() == 0 and start_timeline(hvd, self.timeline)
            out = hvd.allreduce_(probe, op=hvd.Sum, name=name)
            self.sync(out)
            if record:
                hvd.stop_timeline()
            ok = bool(torch.all(out == expected_sum(self.n)).item())
            self.seen["device"] = str(out.device)
            return self.verdict(ok, "probe.check")

        return self.measure(nbytes, lambda: hvd.allreduce_(buffer, op=hvd.Sum, name=name),
                            check)

    def sharded(self, nbytes: int, collective: str) -> dict[str, Any]:
        """One row of hvd.allgather (a part in, S out) or hvd.reducescatter (sum; S in, a part
        out); the check's input is rank + 1 everywhere, its output held to the expected one."""
        hvd, n, part = self.hvd, self.n, nbytes // DTYPE_BYTES // self.n
        gather = collective == ar.ALL_GATHER
        tag = "allgather" if gather else "reducescatter"
        src = torch.zeros(part if gather else part * n, dtype=torch.float32, device=self.device)
        want = (torch.tensor(ar.expected_gather(n), dtype=torch.float32, device=self.device)
                .repeat_interleave(part) if gather
                else torch.full((part,), expected_sum(n), device=self.device))
        name = f"{tag}.probe.{nbytes}"

        def check() -> bool:
            mine = self.mine(src.numel())
            got = (hvd.allgather(mine, name=name) if gather
                   else hvd.reducescatter(mine, op=hvd.Sum, name=name))
            self.sync(got)
            return self.verdict(bool(torch.equal(got, want)), f"probe.check.{tag}")

        timed = ((lambda: hvd.allgather(src, name=name)) if gather
                 else (lambda: hvd.reducescatter(src, op=hvd.Sum, name=name)))
        return self.measure(nbytes, timed, check, collective)

    def evidence(self) -> dict[str, Any]:
        """What Horovod says of the ranks, their buffers' devices and the timeline."""
        hvd, n = self.hvd, self.n
        rank_devices = hvd.allgather_object({"rank": hvd.rank(), "local_rank": hvd.local_rank(),
                                             "buffer_device": self.seen["device"]})
        if [r["rank"] for r in rank_devices] != list(range(n)):
            raise Invalid(f"hvd.allgather_object answered ranks "
                          f"{[r['rank'] for r in rank_devices]} for hvd.size()={n}")
        activities = timeline_activities(self.timeline) if hvd.rank() == 0 else []
        return {
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
            # the reduction itself (GLOO_ALLREDUCE, NCCL_ALLREDUCE, MPI_ALLREDUCE, ...): not
            # the negotiation, not the enclosing ALLREDUCE
            "operation": next((a for a in activities if a.endswith("_ALLREDUCE")
                               and not a.startswith("NEGOTIATE")), None),
            "source": code("torch.horovod_probe_source"),
        }


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.num_nodes > 1:
        raise Unavailable("the Horovod all-reduce probe runs on one node (horovodrun's "
                          "local gloo launch); across nodes it is not built")
    ranks = init_ranks(spec)  # hvd.init(), the rank's device; Invalid unless hvd.size() == N
    scratch = tempfile.TemporaryDirectory(prefix="hvd-timeline-")
    probe = Collectives(spec, ranks, Path(scratch.name) / "timeline.json")
    sizes = probe_sizes(spec.model)
    start = time.time()
    rows = [probe.allreduce(nbytes, nbytes == sizes[-1]) for nbytes in sizes]
    how = f"{controller()} controller"
    collectives = {
        name: ar.measure_collective(name, spec.model, probe.n,
                                    lambda nbytes, name=name: probe.sharded(nbytes, name),
                                    f"{call}, {how}")
        for name, call in ((ar.ALL_GATHER, "hvd.allgather"),
                           (ar.REDUCE_SCATTER, "hvd.reducescatter (sum)"))
    }
    window = (start, time.time())
    evidence = probe.evidence()
    scratch.cleanup()
    operation = f", {evidence['operation']}" if evidence["operation"] else ""
    result = probe_result(rows, spec.model, f"hvd.allreduce_ (sum), {how}{operation}",
                          evidence, framework_versions("horovod"), window=window,
                          collectives=collectives, devices=ranks.devices,
                          rank_threads=threads_record(ranks, THREADS_NOTE))
    return closing(ranks, result)


if __name__ == "__main__":
    main(benchmark)
