"""The TensorFlow all-reduce probe (mode allreduce): the replica context's all_reduce(SUM) in
strategy.run under MirroredStrategy, as Keras 3 sums gradients; all-gather its all_gather;
no reduce-scatter in tf.distribute (unavailable). Differs: one flat buffer per call, one
machine only. docs/runners/tf_allreduce.md, "Notes from the code"."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import tensorflow as tf

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from contract.reasons import code
from runners.common import Spec, Unavailable, main
from runners.tf.devices import cross_device_ops_used, setup_devices
from runners.tf.placement import collective_nodes, device_key, eager_placement

SUM = tf.distribute.ReduceOp.SUM


def make_strategy(spec: Spec) -> tuple[tf.distribute.MirroredStrategy, list[dict[str, Any]]]:
    """MirroredStrategy over the run's devices with TensorFlow's default cross-device ops;
    Unavailable unless that default is the collective all-reduce this probe measures."""
    if spec.num_nodes > 1:
        raise Unavailable("the TensorFlow all-reduce probe runs on one machine (a "
                          "MirroredStrategy over its devices); across nodes it is not built")
    names, devices = setup_devices(spec)
    strategy = tf.distribute.MirroredStrategy(devices=names)
    cross = cross_device_ops_used(strategy)
    if cross != "CollectiveAllReduce":
        raise Unavailable(f"MirroredStrategy (TensorFlow {tf.__version__}) chose {cross} over "
                          f"{names}, not CollectiveAllReduce: the collective all-reduce this "
                          "probe measures is not what it runs here")
    return strategy, devices


def replica_buffers(strategy: tf.distribute.Strategy, elements: int) -> Any:
    """A PerReplica float32 vector of `elements` per replica, replica i's filled with i + 1, each
    made on its replica's device (the value function runs without a device scope)."""
    devices = strategy.extended.worker_devices

    def value(ctx: tf.distribute.experimental.ValueContext) -> tf.Tensor:
        i = ctx.replica_id_in_sync_group
        with tf.device(devices[i]):
            return tf.fill([elements], tf.constant(i + 1, tf.float32))

    return strategy.experimental_distribute_values_from_function(value)


def replica_fn(strategy: tf.distribute.Strategy, gather: bool) -> Any:
    """A tf.function: the replica context's all_reduce(SUM) (as Keras 3's), or its all_gather
    (axis 0), inside strategy.run."""

    def replica(x: tf.Tensor) -> tf.Tensor:
        ctx = tf.distribute.get_replica_context()
        return ctx.all_gather(x, axis=0) if gather else ctx.all_reduce(SUM, x)

    @tf.function
    def collective(values: Any) -> Any:
        return strategy.run(replica, args=(values,))

    return collective


def sync(strategy: tf.distribute.Strategy, out: Any) -> None:
    """Wait until every replica's result is computed: read one element of each back to the
    host (a GPU's stream is done with the all-reduce once its last element can be read)."""
    for t in strategy.experimental_local_results(out):
        t[-1].numpy()


def collective_placement(run_metadata: Any) -> dict[str, Any]:
    """The collective ops TF ran, from the instantiated function's partition graphs: per device
    the count of each collective op type, and their communication_hint attributes."""
    nodes, hints = collective_nodes(run_metadata)
    by_device: dict[str, dict[str, int]] = {}
    for node in nodes:
        ops = by_device.setdefault(device_key(node.device), {})
        ops[node.op] = ops.get(node.op, 0) + 1
    return {"by_device": dict(sorted(by_device.items())), "communication_hints": hints}


class AllReduceSizes:
    """The all-reduce at every probe size; each size's first call (its check) collects the
    collective ops TF placed and the devices of each replica's input and output."""

    def __init__(self, spec: Spec, strategy: tf.distribute.Strategy) -> None:
        self.spec, self.strategy = spec, strategy
        self.n = strategy.num_replicas_in_sync  # the parent checks it against the run's devices
        self.all_reduce = replica_fn(strategy, gather=False)
        self.expected = expected_sum(self.n)
        self.seen: dict[str, Any] = {}

    def check(self, buffers: Any) -> bool:
        """One all-reduce (its first call: the function is traced and instantiated for this
        size, its partition graphs collected), every replica's result read back."""
        local = self.strategy.experimental_local_results
        with eager_placement() as placement:
            out = self.all_reduce(buffers)
            results = [t.numpy() for t in local(out)]
        self.seen["collectives"] = collective_placement(placement.run_metadata)
        self.seen["input_devices"] = [t.device for t in local(buffers)]
        self.seen["output_devices"] = [t.device for t in local(out)]
        return len(results) == self.n and all(bool(np.all(r == self.expected))
                                              for r in results)

    def measure(self, nbytes: int) -> dict[str, Any]:
        buffers = replica_buffers(self.strategy, nbytes // DTYPE_BYTES)
        return measure_size(nbytes, self.n, lambda: self.all_reduce(buffers),
                            lambda out: sync(self.strategy, out), self.spec.warmup_steps,
                            self.spec.measure_steps, ar.Around(check=lambda: self.check(buffers)))


def other_collectives(spec: Spec, strategy: tf.distribute.Strategy) -> dict[str, Any]:
    """All-gather measured (each replica's S/n-byte part, replica r's filled with r + 1);
    reduce-scatter recorded unavailable (tf.distribute's ReplicaContext has none)."""
    n = strategy.num_replicas_in_sync
    all_gather = replica_fn(strategy, gather=True)

    def measure_all_gather(nbytes: int) -> dict[str, Any]:
        part = nbytes // DTYPE_BYTES // n
        parts = replica_buffers(strategy, part)
        want = np.repeat(np.array(ar.expected_gather(n), dtype=np.float32), part)

        def check() -> bool:
            out = all_gather(parts)
            results = [t.numpy() for t in strategy.experimental_local_results(out)]
            return len(results) == n and all(np.array_equal(r, want) for r in results)

        return measure_size(nbytes, n, lambda: all_gather(parts),
                            lambda out: sync(strategy, out), spec.warmup_steps,
                            spec.measure_steps, ar.Around(check=check), collective=ar.ALL_GATHER)

    context = tf.distribute.ReplicaContext
    collectives = {
        ar.ALL_GATHER: ar.measure_collective(
            ar.ALL_GATHER, spec.model, n, measure_all_gather,
            "MirroredStrategy ReplicaContext.all_gather (CollectiveGatherV2)"),
        ar.REDUCE_SCATTER: ar.unavailable_section(
            ar.REDUCE_SCATTER,
            f"tf.distribute (TensorFlow {tf.__version__}) has no reduce-scatter: "
            "ReplicaContext has " + ", ".join(
                m for m in ("all_reduce", "all_gather", "reduce_scatter")
                if hasattr(context, m)) + " only"),
    }
    if hasattr(context, "reduce_scatter"):  # a TensorFlow that has one: say so, not measured
        collectives[ar.REDUCE_SCATTER]["reason"] = (
            f"TensorFlow {tf.__version__}'s ReplicaContext has reduce_scatter; this probe "
            "does not measure it yet")
    return collectives


def benchmark(spec: Spec) -> dict[str, Any]:
    strategy, devices = make_strategy(spec)
    sizes = AllReduceSizes(spec, strategy)
    n, seen = sizes.n, sizes.seen
    start = time.time()
    rows = [sizes.measure(nbytes) for nbytes in probe_sizes(spec.model)]
    collectives = other_collectives(spec, strategy)
    window = (start, time.time())
    # the collective implementation MirroredStrategy set for its CollectiveAllReduce
    impl = strategy.extended._communication_options.implementation  # noqa: SLF001
    impl = getattr(impl, "name", str(impl))
    cross = cross_device_ops_used(strategy)
    evidence = {
        "replicas": n,
        "world_size": n,
        "devices": seen["input_devices"],
        "cross_device_ops": cross,
        "communication_implementation": impl,
        "output_devices": seen["output_devices"],
        "collective_ops": seen["collectives"],
        "collective_devices": len(seen["collectives"]["by_device"]),
        "source": code("tf.allreduce_probe_source"),
    }
    hints = "/".join(seen["collectives"]["communication_hints"]) or impl.lower()
    return probe_result(
        rows, spec.model,
        f"MirroredStrategy {cross} ({hints}): CollectiveReduceV2", evidence,
        {"tensorflow": tf.__version__, "numpy": np.__version__}, window=window,
        collectives=collectives, devices=devices)


if __name__ == "__main__":
    main(benchmark)
