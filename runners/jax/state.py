"""The JAX runners' model-state record (state_bytes_per_device): per device and part, the bytes of
every shard jax holds there, each part's logical size; nothing derived from a requested sharding.
The reduction dtype is read from the compiled program (precision_record). jax inside functions."""

from __future__ import annotations

import re
from typing import Any

from contract.precision_policy import resolve
from runners.jax.common import allgather_json

PARTS = ("params", "grads", "optimizer")
HLO_TYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}


def arrays(tree: Any) -> list[Any]:
    """The jax Arrays among a pytree's leaves (a Keras variable gives its .value)."""
    import jax

    out = []
    for leaf in jax.tree_util.tree_leaves(tree):
        value = getattr(leaf, "value", leaf)  # keras.Variable -> its jax Array
        if isinstance(value, jax.Array):
            out.append(value)
    return out


def bytes_per_device(tree: Any) -> dict[str, int]:
    """{str(device): bytes of the tree's shards on it}, from each array's addressable_shards."""
    held: dict[str, int] = {}
    for array in arrays(tree):
        for shard in array.addressable_shards:
            key = str(shard.device)
            if not array.is_fully_addressable:
                key = f"{key} (process {shard.device.process_index})"
            held[key] = held.get(key, 0) + int(shard.data.nbytes)
    return held


def state_record(parts: dict[str, Any], devices: list[Any], source: str) -> dict[str, Any]:
    """The record's state_bytes_per_device (every device of the run, each part; a device
    holding none of a part: 0), state_bytes_global and state_source, from the trees of
    `parts` ({"params": tree, "grads": tree, "optimizer": tree}). A collective across
    processes: every process must call it."""
    local = {part: bytes_per_device(parts[part]) for part in PARTS}
    per_device: dict[str, dict[str, int]] = {}
    for held in allgather_json(local):
        for part, rows in held.items():
            for device, n in rows.items():
                per_device.setdefault(device, dict.fromkeys(PARTS, 0))[part] += int(n)
    if len(per_device) < len(devices) and all(d.process_index == 0 for d in devices):
        for device in devices:  # one process: a device holding nothing is shown so
            per_device.setdefault(str(device), dict.fromkeys(PARTS, 0))
    return {"state_bytes_per_device": per_device,
            # each part's logical size: its arrays' nbytes (unsharded shape x itemsize)
            "state_bytes_global": {part: sum(int(a.nbytes) for a in arrays(parts[part]))
                                   for part in PARTS},
            "state_source": source}


def reduction_dtypes(hlo: str) -> list[str]:
    """The element types of the all-reduce and reduce-scatter results in a compiled HLO text
    (sorted names: "float32", "bfloat16"); [] when it has none (one device)."""
    found: set[str] = set()
    for line in hlo.splitlines():
        m = re.search(r"=\s*(.*?)\s(?:all-reduce|reduce-scatter)(?:-start)?\(", line)
        if m:
            found.update(HLO_TYPES.get(t, t) for t in re.findall(r"\b([a-z]+\d+)\[", m[1]))
    return sorted(found)


def dtypes_of(tree: Any) -> str:
    """The dtype of a tree's floating arrays, as one name ("float32"), or "a, b" if mixed."""
    import jax.numpy as jnp

    names = sorted({str(a.dtype) for a in arrays(tree) if jnp.issubdtype(a.dtype, jnp.floating)})
    return ", ".join(names) or "none"


def precision_record(precision: str, *, compute: Any, params: Any, grads: Any, hlo: str | None,
                     how: str, program: str = "the compiled step") -> dict[str, Any]:
    """precision_policy: the compute dtype the model was built with, the params' dtype and the
    gradient reduction's: the dtypes of the all-reduce/reduce-scatter ops in `program`'s HLO
    (where there are none, one device, the gradients' own dtype: nothing is reduced)."""
    reduced = reduction_dtypes(hlo) if hlo else []
    reduce = ", ".join(reduced) if reduced else dtypes_of(grads)
    where = (f"the all-reduce/reduce-scatter element types of {program}" if reduced else
             f"the gradients' dtype (no cross-device reduction in {program})")
    return {"precision_policy": resolve(precision, compute=compute, params=dtypes_of(params),
                                        reduce=reduce, how=f"{how}; reduce read from {where}")}


def compute_dtype(dtype: Any) -> str:
    """The compute dtype's name; float32 under jax_default_matmul_precision "tensorfloat32"
    (runners/math_mode.py's tf32) is "tf32", as the harness policy names it."""
    import jax
    import numpy as np

    name = "float32" if dtype is None else np.dtype(dtype).name
    if name == "float32" and jax.config.jax_default_matmul_precision == "tensorfloat32":
        return "tf32"
    return name


def keras_gradients(model: Any, x: Any, y: Any) -> tuple[Any, str]:
    """(the gradients of a compiled Keras model's loss on (x, y), the compiled HLO text): one
    call of a jitted jax.value_and_grad of model.compute_loss_and_updates (the function Keras'
    jax train_step differentiates, training=True) at the model's current variables, with no
    output sharding asked for, so XLA returns them laid out as it holds them."""
    import jax

    values = [[v.value for v in variables] for variables in (
        model.trainable_variables, model.non_trainable_variables, model.metrics_variables,
        model.optimizer.variables)]

    def grads(trainable: Any, non_trainable: Any, metrics: Any, optimizer: Any, x: Any,
              y: Any) -> Any:
        return jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)(
            trainable, non_trainable, metrics, x, y, None, training=True,
            optimizer_variables=optimizer)[1]

    compiled = jax.jit(grads).lower(*values, x, y).compile()
    return jax.block_until_ready(compiled(*values, x, y)), compiled.as_text()


def keras_state(model: Any, batch: tuple[Any, Any], devices: list[Any], source: str,
                precision: str, how: str) -> dict[str, Any]:
    """A Keras model's state record (its trainable variables, keras_gradients' gradients on
    `batch`, its optimizer's variables, each variable's jax Array) and precision_policy (the
    dtype policy's compute dtype, the variables' dtype, the reduction read from the gradient
    function's HLO: the same forward and backward as Keras' train step)."""
    grads, hlo = keras_gradients(model, *batch)
    parts = {"params": model.trainable_variables, "grads": grads,
             "optimizer": model.optimizer.variables}
    return {**state_record(parts, devices, source),
            **precision_record(precision, compute=compute_dtype(model.dtype_policy.compute_dtype),
                               params=model.trainable_variables, grads=grads, hlo=hlo, how=how,
                               program="the compiled gradient function (Keras' "
                                       "compute_loss_and_updates under jax.value_and_grad)")}
