"""jax_allreduce: XLA's all-reduce, all-gather and reduce-scatter as JAX issues them (lax.psum,
all_gather, psum_scatter), each alone in a jitted shard_map over the run's devices, timed as
nccl-tests times them (contract/collectives.py) and checked; evidence read from JAX and XLA.
Differs from a jit step: one flat buffer per call, nothing to overlap, one machine.
docs/runners/jax_allreduce.md."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from contract.reasons import code
from runners.common import Spec, Unavailable, main
from runners.jax.common import framework_versions, setup_devices

AXIS = "x"
CALLS = {ar.ALL_REDUCE: "jax.lax.psum", ar.ALL_GATHER: "jax.lax.all_gather(tiled=True)",
         ar.REDUCE_SCATTER: "jax.lax.psum_scatter(tiled=True)"}
HLO_OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def per_device_fn(mesh: Any, name: str) -> Callable[[Any], Any]:
    """The jitted shard_map over the mesh's axis of collective `name` (each device's block in,
    its result out), or with name "fill" each device's block filled with its index + 1."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def per_device(b: Any) -> Any:
        if name == ar.ALL_REDUCE:
            return jax.lax.psum(b, AXIS)
        if name == ar.ALL_GATHER:
            return jax.lax.all_gather(b, AXIS, tiled=True)
        if name == ar.REDUCE_SCATTER:
            return jax.lax.psum_scatter(b, AXIS, scatter_dimension=0, tiled=True)
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


class Collectives:
    """The probe over the run's devices: the mesh, each collective jitted, what was seen."""

    def __init__(self, devices: list[Any]) -> None:
        import numpy as np
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        self.platform = str(devices[0].platform)  # as jax names it: cpu, gpu
        self.mesh = Mesh(np.array(devices), (AXIS,))
        self.n = self.mesh.size
        self.sharding = NamedSharding(self.mesh, P(AXIS))
        self.fill = per_device_fn(self.mesh, "fill")
        self.fns = {name: per_device_fn(self.mesh, name) for name in ar.COLLECTIVES}
        self.seen: dict[str, Any] = {"hlo": {}}

    def check(self, name: str, src: Any, want: Any) -> bool:
        """One call on filled input: every output block as expected; what it ran on, seen."""
        import numpy as np

        fn = self.fns[name]
        out = fn(self.fill(src))
        blocks = sorted(out.addressable_shards, key=lambda s: s.index[0].start or 0)
        self.seen["replicas"] = len(out.sharding.device_set)
        self.seen["input_devices"] = [str(s.device) for s in sorted(
            src.addressable_shards, key=lambda s: s.index[0].start or 0)]
        self.seen["output_devices"] = [str(s.device) for s in blocks]
        self.seen["hlo"][name] = hlo_collectives(fn, src)
        return len(blocks) == self.n and all(np.array_equal(np.asarray(s.data), want)
                                             for s in blocks)

    def measure(self, spec: Spec, nbytes: int, name: str) -> dict[str, Any]:
        """One row of `name` at S = nbytes: each device's input is S bytes (all-reduce and
        reduce-scatter) or S/n (all-gather)."""
        import jax
        import numpy as np

        n, fn = self.n, self.fns[name]
        part = nbytes // DTYPE_BYTES // n
        per_in = part if name == ar.ALL_GATHER else nbytes // DTYPE_BYTES
        # n blocks of per_in float32 zeros, one on each device (made there)
        src = jax.block_until_ready(jax.jit(
            lambda: jax.numpy.zeros((n * per_in,), jax.numpy.float32),
            out_shardings=self.sharding)())
        if name == ar.ALL_GATHER:
            want = np.repeat(np.array(ar.expected_gather(n), np.float32), part)
        else:
            want = np.full((part if name == ar.REDUCE_SCATTER else per_in,), expected_sum(n),
                           np.float32)
        pending: list[Any] = []

        def call() -> Any:
            out = fn(src)
            pending.append(out)
            return out

        def sync(_: Any) -> None:
            jax.block_until_ready(pending)  # every call issued since the last sync
            pending.clear()

        return measure_size(nbytes, n, call, sync, spec.warmup_steps, spec.measure_steps,
                            ar.Around(check=lambda: self.check(name, src, want)), collective=name)

    def evidence(self, seen: dict[str, Any]) -> dict[str, Any]:
        """The record's evidence: the all-reduce's `seen`, the mesh, the HLO of each."""
        return {
            "replicas": seen["replicas"],
            "world_size": self.n,
            "devices": seen["input_devices"],
            "output_devices": seen["output_devices"],
            "mesh": dict(self.mesh.shape),
            "platform": self.platform,
            "hlo_collectives": self.seen["hlo"],
            "source": code("jax.allreduce_probe_source"),
        }


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.num_nodes > 1:
        raise Unavailable("the JAX collectives probe runs on one machine (one process over its "
                          "devices); across nodes it is not built")
    devices, described = setup_devices(spec)
    probe = Collectives(devices)
    how = f"under jax.shard_map, jitted (XLA {probe.platform})"
    start = time.time()
    rows = [probe.measure(spec, nbytes, ar.ALL_REDUCE) for nbytes in probe_sizes(spec.model)]
    all_reduce_seen = {k: probe.seen[k] for k in ("replicas", "input_devices", "output_devices")}
    collectives = {
        name: ar.measure_collective(name, spec.model, probe.n,
                                    lambda nbytes, name=name: probe.measure(spec, nbytes, name),
                                    f"{CALLS[name]} {how}")
        for name in (ar.ALL_GATHER, ar.REDUCE_SCATTER)
    }
    window = (start, time.time())
    return probe_result(rows, spec.model, f"{CALLS[ar.ALL_REDUCE]} {how}",
                        probe.evidence(all_reduce_seen), framework_versions(), window=window,
                        collectives=collectives, devices=described)


if __name__ == "__main__":
    main(benchmark)
