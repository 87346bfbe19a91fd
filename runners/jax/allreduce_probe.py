"""The JAX collectives probe (mode allreduce, probe jax_allreduce, issue 27): XLA's all-reduce,
all-gather and reduce-scatter as JAX programs issue them, jax.lax.psum, jax.lax.all_gather
(tiled) and jax.lax.psum_scatter (tiled) inside jax.shard_map over a one-axis Mesh of the
run's devices, each jitted.

Devices: one process driving spec.num_devices jax devices (runners/jax/common.setup_devices, as
jax_native): N virtual CPU devices (XLA_FLAGS --xla_force_host_platform_device_count, set
before jax is imported) on CPU, the first N GPUs on GPU (XLA's collectives there are NCCL's).
Every buffer is a global float32 array sharded over the mesh axis (PartitionSpec("x")), so each
device holds its own replica's buffer; each collective is a jitted shard_map whose per-device
function is the collective alone, its output laid out the same way (one block per device: each
device's own result, read back shard by shard for the check).
- all-reduce: psum(b, "x") of each device's buffer of S bytes (contract.collectives.probe_sizes),
  what a data-parallel jit step's gradient sum compiles to (an XLA all-reduce).
- all-gather: all_gather(b, "x", tiled=True) of each device's part of S/n bytes into an S-byte
  result on every device (how FSDP-style sharded parameters are gathered: jax_fsdp's weights).
- reduce-scatter: psum_scatter(b, "x", tiled=True) of an S-byte input into each device's
  S/n-byte part (a sharded gradient's reduction).
S is nccl-tests' (contract/collectives.collective_bytes). The timed inputs hold zeros and are
not changed by the collectives (JAX's outputs are new arrays, as a step's reduced gradients
are), so every call moves the same values.
Timing: contract/collectives.measure_size, as nccl-tests times it: `warmup` untimed calls, then
the timed calls dispatched back to back (JAX dispatches asynchronously) and the clock stopped
once jax.block_until_ready has returned for the output of every call issued since the last
sync (not only the last one's: on CPU the runtime may run independent executions
concurrently, so the last call finishing first would not mean the others had). One process
times every device at once: no mean across ranks to take, no barrier.
Checks: each device's input filled with its index along the axis + 1 (lax.axis_index, on the
device), then every device's output block read back: n(n+1)/2 everywhere for the all-reduce
and the reduce-scatter, the parts 1, 2, ..., n in device order for the all-gather.
Evidence (read back from JAX and XLA): replicas = the number of devices the collective's
output is laid over (len(sharding.device_set)), devices = the device of each block of the
timed input (addressable_shards), the mesh's shape, and the collective ops in XLA's compiled
HLO of each jitted function (op names with their replica_groups) and the backend's platform.

Follows jax 0.10.2 (jax.shard_map, jax.lax collectives). Differs from what a jit step runs:
one flat buffer per call instead of XLA's combined gradient all-reduces (XLA's
AllReduceCombiner merges a step's small all-reduces into larger ones), no compute to overlap
with, and the probe's sizes. One machine only (the probes do not cross nodes).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from runners.common import Spec, Unavailable, main
from runners.jax.common import framework_versions, setup_devices

AXIS = "x"
CALLS = {ar.ALL_REDUCE: "jax.lax.psum", ar.ALL_GATHER: "jax.lax.all_gather(tiled=True)",
         ar.REDUCE_SCATTER: "jax.lax.psum_scatter(tiled=True)"}
HLO_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def collective_fn(mesh: Any, collective: str) -> Callable[[Any], Any]:
    """The jitted collective over the mesh's axis: each device's block in, its result out."""
    import jax
    from jax.sharding import PartitionSpec as P

    def per_device(b: Any) -> Any:
        if collective == ar.ALL_REDUCE:
            return jax.lax.psum(b, AXIS)
        if collective == ar.ALL_GATHER:
            return jax.lax.all_gather(b, AXIS, tiled=True)
        return jax.lax.psum_scatter(b, AXIS, scatter_dimension=0, tiled=True)

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))


def fill_fn(mesh: Any) -> Callable[[Any], Any]:
    """A jitted function filling each device's block of an array with its index + 1, on the
    device itself."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def per_device(b: Any) -> Any:
        return b + (jax.lax.axis_index(AXIS) + 1).astype(jnp.float32)

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))


def hlo_collectives(fn: Any, arg: Any) -> dict[str, Any]:
    """The collective ops in XLA's compiled HLO of `fn` for `arg`: each op kind's count and
    the replica_groups (or source_target_pairs) they carry."""
    text = fn.lower(arg).compile().as_text()
    ops: dict[str, int] = {}
    groups: set[str] = set()
    for line in text.splitlines():
        m = re.search(r"=\s*\S+\s+(" + "|".join(HLO_OPS) + r")(-start)?\(", line)
        if not m:
            continue
        ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        g = re.search(r"(replica_groups=\S+|source_target_pairs=\S+)", line)
        if g:
            groups.add(g.group(1).rstrip(","))
    return {"ops": ops, "groups": sorted(groups)}


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.num_nodes > 1:
        raise Unavailable("the JAX collectives probe runs on one machine (one process over its "
                          "devices); across nodes it is not built")
    devices, described = setup_devices(spec)
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), (AXIS,))
    n = mesh.size
    sharding = NamedSharding(mesh, P(AXIS))
    fill = fill_fn(mesh)
    fns = {name: collective_fn(mesh, name) for name in ar.COLLECTIVES}
    seen: dict[str, Any] = {"hlo": {}}

    def zeros(per_device: int) -> Any:
        """A global array of n blocks of per_device float32 zeros, one block on each device
        (made on the devices)."""
        return jax.jit(lambda: jax.numpy.zeros((n * per_device,), jax.numpy.float32),
                       out_shardings=sharding)()

    def measure(nbytes: int, name: str) -> dict[str, Any]:
        """One row of `name` at S = nbytes: each device's input is S bytes (all-reduce and
        reduce-scatter) or S/n (all-gather)."""
        part = nbytes // DTYPE_BYTES // n
        per_in = part if name == ar.ALL_GATHER else nbytes // DTYPE_BYTES
        fn = fns[name]
        src = jax.block_until_ready(zeros(per_in))
        if name == ar.ALL_GATHER:
            want = np.repeat(np.array(ar.expected_gather(n), np.float32), part)
        else:
            want = np.full((part if name == ar.REDUCE_SCATTER else per_in,), expected_sum(n),
                           np.float32)

        def check() -> bool:
            out = fn(fill(src))
            blocks = sorted(out.addressable_shards, key=lambda s: s.index[0].start or 0)
            seen["replicas"] = len(out.sharding.device_set)
            seen["input_devices"] = [str(s.device) for s in
                                     sorted(src.addressable_shards,
                                            key=lambda s: s.index[0].start or 0)]
            seen["output_devices"] = [str(s.device) for s in blocks]
            seen["hlo"][name] = hlo_collectives(fn, src)
            return len(blocks) == n and all(np.array_equal(np.asarray(s.data), want)
                                            for s in blocks)

        pending: list[Any] = []

        def call() -> Any:
            out = fn(src)
            pending.append(out)
            return out

        def sync(_: Any) -> None:
            jax.block_until_ready(pending)  # every call issued since the last sync
            pending.clear()

        return measure_size(nbytes, n, call, sync, spec.warmup_steps, spec.measure_steps,
                            check=check, collective=name)

    start = time.time()
    rows = [measure(nbytes, ar.ALL_REDUCE) for nbytes in probe_sizes(spec.model)]
    all_reduce_seen = {k: seen[k] for k in ("replicas", "input_devices", "output_devices")}
    collectives = {
        name: ar.measure_collective(name, spec.model, n,
                                    lambda nbytes, name=name: measure(nbytes, name),
                                    f"{CALLS[name]} under jax.shard_map, jitted (XLA "
                                    f"{platform(devices)})")
        for name in (ar.ALL_GATHER, ar.REDUCE_SCATTER)
    }
    window = (start, time.time())
    evidence = {
        "replicas": all_reduce_seen["replicas"],
        "world_size": n,
        "devices": all_reduce_seen["input_devices"],
        "output_devices": all_reduce_seen["output_devices"],
        "mesh": dict(mesh.shape),
        "platform": platform(devices),
        "hlo_collectives": seen["hlo"],
        "source": "replicas: len(output.sharding.device_set) of the all-reduce; devices: "
                  ".device of each block of the input (addressable_shards); world_size: "
                  "Mesh.size; hlo_collectives: the collective ops of each jitted function's "
                  "compiled HLO (jit(...).lower(x).compile().as_text()), from the last "
                  "size checked",
    }
    return probe_result(rows, spec.model,
                        f"{CALLS[ar.ALL_REDUCE]} under jax.shard_map, jitted (XLA "
                        f"{platform(devices)})",
                        evidence, framework_versions(), window=window,
                        collectives=collectives, devices=described)


def platform(devices: list[Any]) -> str:
    """The devices' platform as jax names it (cpu, gpu)."""
    return str(devices[0].platform)


if __name__ == "__main__":
    main(benchmark)
