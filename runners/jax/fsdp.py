"""JAX FSDP (fully sharded data parallelism) the way MaxText does it: one jitted train step over
a 1-D device mesh whose one axis, "fsdp", splits both the batch and the model state; XLA's SPMD
partitioner gathers each layer's parameters where the step needs them (jax 0.10.2, Flax linen,
optax). jax_native's step (runners/jax/native.py) with a sharded state layout instead of a
replicated one.

Processes: one process drives all N devices (N virtual CPU devices through XLA_FLAGS
--xla_force_host_platform_device_count, or N GPUs); across nodes one process per node, joined
by jax.distributed.initialize (runners/jax/common.py), the mesh spanning every process's
devices, as jax_native.
Split: the N devices form a Mesh with one axis, "fsdp". The global batch is sharded along axis
0 over it (NamedSharding(mesh, P("fsdp"))): B/N rows per device, as jax_native's "data" axis.
Parameters: every leaf of the train state (params, the SGD momentum, BatchNorm statistics) is
sharded over the same axis along its largest dimension divisible by N (ties: the first such
dimension), as MaxText maps its "fsdp" mesh axis onto each weight's embed dimension through its
logical axis rules; a leaf with no dimension divisible by N (the step counter, a scalar; a bias
of odd width) stays replicated (NamedSharding(mesh, P())) and counts as replicated in the state
record (its full bytes on every device). The optimizer state (optax's momentum trace) has its
parameter's shape, so it gets its parameter's sharding: each device holds 1/N of the params and
of the momentum, as ZeRO-3 / FSDP do. The state is created under jit straight into those
shardings (create_state), and the step's in_shardings and out_shardings pin them (the state
donated, updated in place).
Gather and reduce: the step is written for the global batch (value_and_grad of the mean
cross-entropy over all B rows) under plain jit, as jax_native's batchnorm: global. Given a
sharded weight and a batch sharded over the same axis, XLA's SPMD partitioner all-gathers each
weight where the forward (and again the backward) uses it, per layer; the gradients are
constrained to the parameters' shardings (jax.lax.with_sharding_constraint, where value_and_grad
returns them), so XLA reduces each into its shards, which feed the sharded update. The compiled
step's collectives are counted from its HLO and recorded: all-gathers of the weights, and the
gradients' reduction, which XLA's CPU backend emits as all-reduce then a slice per device
(reduce-scatter where the backend has it, e.g. NCCL on GPUs). What XLA schedules is XLA's: it
may keep a gathered weight from the forward for the backward, or gather it again; MaxText's
remat policies steer that and are not used here.
Synchronise: every device applies its shard of the same reduced update inside one program
(synchronous SGD).
Count: samples from the train state's step counter (Flax TrainState.step), as jax_native.
Placement (`placement`): the rows of the first timed batch on each device, read from that
jax.Array's addressable_shards; the params' shardings as jax reports them
(`shardings.params`: each leaf's PartitionSpec read from the array, and the leaves left
replicated).
BatchNorm: over the global batch (XLA all-reduces each BatchNorm's moments over the sharded
batch: sync BatchNorm). jax_native's per_device mode runs its step under shard_map with each
device's whole replica of the state, which a sharded state does not have; so jax_fsdp has no
`batchnorm` option and a CNN's statistics are jax_native's batchnorm: global.
State (`state_bytes_per_device`): each array's addressable_shards after the timed window
(runners/jax/state.py); the gradients from one extra untimed call of a jitted gradient
function with the step's input shardings and its constraint of the gradients (each device
holds its shard of them: where the step holds them before the update).
Precision: as jax_native (bf16: the Flax model built with dtype=bfloat16, float32 params,
updated by the optimizer; a user's model cast in the step); the reduction dtype is read from
the compiled step's reduce-scatter / all-reduce ops.
Equivalence: the same step (same layout, plain SGD, compiled ahead of time) on the probe model;
its sharded params are gathered (np.asarray on one process, process_allgather across nodes)
before the weights are saved.
What differs from MaxText: no logical-axis rules (the largest divisible dimension instead), no
tensor or sequence axes, no remat policy, no optimizer other than SGD; Flax linen, not NNX.
"""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.jax.native import Layout
from runners.jax.native import benchmark as native_benchmark
from runners.jax.native import equivalence as native_equivalence

AXIS = "fsdp"


def fsdp_dimension(shape: tuple[int, ...], n: int) -> int | None:
    """The dimension a leaf of `shape` is sharded along over n devices: its largest one
    divisible by n (the first of equal ones), None where none divides (replicated)."""
    dims = [i for i, d in enumerate(shape) if d >= n and d % n == 0]
    return max(dims, key=lambda i: (shape[i], -i)) if dims else None


def state_shardings(replicated: Any, abstract: Any) -> Any:
    """The train state's shardings: each array leaf NamedSharding(mesh, P(..., "fsdp", ...))
    along fsdp_dimension, or `replicated` where no dimension divides."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = replicated.mesh
    n = mesh.shape[AXIS]

    def one(leaf: Any) -> Any:
        dim = fsdp_dimension(tuple(leaf.shape), n)
        if dim is None:
            return replicated
        return NamedSharding(mesh, P(*([None] * dim), AXIS))

    return jax.tree_util.tree_map(one, abstract)


def params_record(replicated: Any, params: Any) -> dict[str, Any]:
    """The params' layout as jax reports it: each leaf's PartitionSpec (read from the array's
    sharding) by its path, and the leaves that are fully replicated."""
    import jax

    specs, whole = {}, []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        specs[name] = str(leaf.sharding.spec)
        if leaf.sharding.is_fully_replicated:
            whole.append(name)
    return {"mesh": dict(replicated.mesh.shape), "rule": "each leaf along its largest "
            "dimension divisible by N, replicated where none divides", "leaves": specs,
            "replicated": whole}


FSDP = Layout(
    AXIS, state_shardings, lambda spec: "global", params_record,
    "jax: every array's addressable_shards (shard.data.nbytes per device) after the timed "
    "window: the params and optax state of the train state, sharded over the fsdp axis (a leaf "
    "with no dimension divisible by N is replicated and counted whole on every device; "
    "batch_stats not counted), and the gradients from one extra untimed call of a jitted "
    "gradient function with the step's input shardings and its constraint of the gradients to "
    "the params' shardings, on the first timed batch", constrain_grads=True)


def benchmark(spec: Spec) -> dict[str, Any]:
    return native_benchmark(spec, FSDP)


def equivalence(spec: Spec) -> dict[str, Any]:
    return native_equivalence(spec, FSDP)


if __name__ == "__main__":
    main(benchmark, equivalence)
