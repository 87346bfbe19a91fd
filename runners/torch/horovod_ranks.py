"""Horovod's ranks for the horovod runner and its all-reduce probe: hvd.init(), each rank's device,
and HorovodRanks, a DeviceRank over Horovod's own collectives (horovod.torch imported inside
functions, so a broken install becomes a record)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import torch

from contract.reasons import code
from contract.result import join
from runners import memory
from runners.common import Invalid, Spec, Unavailable, node_identity
from runners.real_data import cores
from runners.torch import dist as td

THREADS_NOTE = code("torch.horovod_threads")


@functools.cache
def horovod() -> Any:
    """horovod.torch, imported inside main() so that a broken install becomes a record."""
    import horovod.torch as hvd

    if not hasattr(hvd, "init"):  # the package imports without its extension, half empty
        raise Unavailable("horovod.torch has no compiled extension in this environment "
                          "(rebuild it: `run_bench.py setup horovod`)")
    return hvd


@dataclass(frozen=True)
class HorovodRanks(td.DeviceRank):
    """A rank among the ranks horovodrun started, its collectives Horovod's."""

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        hvd = horovod()
        return hvd.allreduce(t, op=hvd.Sum)

    def gather(self, obj: Any) -> list[Any]:
        return list(horovod().allgather_object(obj))

    def placement(self, tracker: td.PlacementTracker) -> dict[str, Any]:
        """gather_placement over Horovod's ranks: hvd.rank() and hvd.size() as Horovod counts
        them, the rows gathered with hvd.allgather_object."""
        hvd = horovod()
        source = (f"Horovod (hvd.size()={hvd.size()}, controller {controller()}); "
                  f"{code('torch.rank_rows_hvd_allgather_object')}")
        return td.gather_placement(tracker, hvd.rank(), hvd.size(), self.gather, source)

    def record(self) -> dict[str, Any]:
        out = {"replicas": horovod().size(), "devices": self.devices,
               "controller": controller(), "rank_threads": td.threads_record(self, THREADS_NOTE)}
        return join(out, multi_node_record()) if td.multi_node() else out

    def close(self) -> None:
        horovod().shutdown()


RENDEZVOUS_ENV = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
                  "HOROVOD_GLOO_IFACE", "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")
SLOT_ENV = ("HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
            "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")


def multi_node_record() -> dict[str, Any]:
    """`nodes` and `multi_node` of a multi-node run, gathered through Horovod itself
    (hvd.allgather_object); Invalid when Horovod's view is not the run's nodes x devices_per_node
    or a rank is not the slot horovod_launch gave it."""
    hvd = horovod()
    rows = hvd.allgather_object({
        **node_identity(), "rank": hvd.rank(), "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(), "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "process_rank": os.environ.get("MGBENCH_PROCESS_RANK"),
        "slot_env": {k: os.environ.get(k) for k in SLOT_ENV}})
    nodes = td.group_nodes(rows)
    num_nodes = int(os.environ["MGBENCH_NUM_NODES"])
    if len(nodes) != num_nodes or hvd.cross_size() != num_nodes or \
            hvd.size() != num_nodes * hvd.local_size():
        names = sorted(node["node"] for node in nodes)
        raise Invalid(f"Horovod's ranks are {hvd.size()} on {names} (cross_size "
                      f"{hvd.cross_size()}, local_size {hvd.local_size()}) for a run on "
                      f"{num_nodes} nodes")
    for row in rows:
        given = {k: row["slot_env"][f"HOROVOD_{k.upper()}"] for k in (
            "rank", "local_rank", "local_size", "cross_rank", "cross_size")}
        if any(str(row[k]) != v for k, v in given.items()):
            raise Invalid(f"rank {row['rank']} on {row['node']}: Horovod reports "
                          f"{ {k: row[k] for k in given} }, its slot was {given}")
    return {"nodes": nodes, "multi_node": {
        "mechanism": code("torch.horovod_gloo_rendezvous"),
        "rendezvous": {k: os.environ.get(k) for k in RENDEZVOUS_ENV},
        "world_size": hvd.size(), "size": hvd.size(), "cross_size": hvd.cross_size(),
        "local_size": hvd.local_size(), "controller": controller(),
        "gloo_built": hvd.gloo_built(), "gloo_enabled": hvd.gloo_enabled(),
        "mpi_built": hvd.mpi_built(), "mpi_enabled": hvd.mpi_enabled(),
        "ranks": rows}}


def controller() -> str:
    return "gloo" if horovod().gloo_enabled() else "mpi"


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
        device = td.use_gpu(hvd.local_rank(), hvd.local_size(), "envs/horovod-gpu.txt")
        me = {"name": torch.cuda.get_device_name(device), "kind": "GPU"}
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, cores() // hvd.local_size()))
        me = {"name": f"cpu (rank {hvd.rank()})", "kind": "virtual CPU device (gloo process)"}
    devices = hvd.allgather_object({**me, "rank": hvd.rank()})
    memory.baseline(code("memory.baseline_horovod_init"))
    return HorovodRanks(hvd.rank(), hvd.local_rank(), world, device, devices)
