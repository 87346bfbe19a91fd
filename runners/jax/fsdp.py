"""jax_fsdp: fully sharded data parallelism as MaxText does it: jax_native's jitted step over a 1-D
mesh whose axis "fsdp" splits the batch and every leaf of the train state (along its largest
dimension N divides); XLA all-gathers weights and reduce-scatters gradients; global BatchNorm.
Differs from MaxText: no logical-axis rules, tensor or sequence axes, remat; SGD only; Flax
linen. docs/runners/jax_fsdp.md."""

from __future__ import annotations

from functools import partial
from typing import Any

from contract.reasons import code
from runners.common import main
from runners.jax import flax_run
from runners.jax.flax_step import Layout

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
    code("jax.fsdp_state_source"), constrain_grads=True)

benchmark = partial(flax_run.benchmark, layout=FSDP)
equivalence = partial(flax_run.equivalence, layout=FSDP)


if __name__ == "__main__":
    main(benchmark, equivalence)
