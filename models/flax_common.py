"""JAX/Flax helpers for the flax builders, the child runners and the parity test.

Imports jax and flax: never import this module from the parent process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import FrozenDict, freeze, unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

# Collections counted as model weights: trainable params and BatchNorm running mean/var.
WEIGHT_COLLECTIONS = ("params", "batch_stats")


def check_data_format(data_format: str) -> None:
    """Raise ValueError unless data_format is channels_last (the only layout a Flax model takes)."""
    if data_format != "channels_last":
        # XLA chooses the physical layout itself; NCHW input would only add transposes.
        raise ValueError(f"data_format must be channels_last for Flax models (NHWC input; XLA "
                         f"picks the physical layout): {data_format!r}")


def _size(tree: Any) -> int:
    """Number of scalars in a pytree of arrays."""
    return int(sum(np.prod(np.shape(leaf)) for leaf in jax.tree_util.tree_leaves(tree)))


def count_params_flax(variables: Mapping[str, Any]) -> int:
    """Parameters plus BatchNorm running mean and variance (as Keras counts its weights)."""
    return sum(_size(variables.get(c, {})) for c in WEIGHT_COLLECTIONS)


def count_trainable_flax(variables: Mapping[str, Any]) -> int:
    """The "params" collection only."""
    return _size(variables.get("params", {}))


def count_flops_flax(model: nn.Module, input_shape_hwc: tuple[int, int, int]) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv and Dense layers (bias ignored)."""
    flops = 0

    def count(next_fun: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              context: nn.module.InterceptorContext) -> Any:
        nonlocal flops
        out = next_fun(*args, **kwargs)
        m = context.module
        if context.method_name != "__call__":
            return out
        if isinstance(m, nn.Conv):
            cin = args[0].shape[-1] // m.feature_group_count
            kernel = int(np.prod(m.kernel_size))
            positions = int(np.prod(out.shape[1:-1]))  # batch of 1: the spatial output positions
            flops += 2 * kernel * cin * m.features * positions
        elif isinstance(m, nn.Dense):
            rows = int(np.prod(out.shape)) // m.features  # a Dense may see extra dims
            flops += 2 * args[0].shape[-1] * m.features * rows
        return out

    x = jax.ShapeDtypeStruct((1, *input_shape_hwc), jnp.float32)
    # eval_shape traces one init forward pass without computing or allocating anything.
    with nn.intercept_methods(count):
        jax.eval_shape(lambda x: model.init_with_output(
            {"params": jax.random.key(0), "dropout": jax.random.key(1)}, x, train=False), x)
    return int(flops)


def _canonical_leaves(variables: Mapping[str, Any]) -> dict[str, Any]:
    """{"<module path>/<kernel|bias>": leaf} of the params; ValueError for other weights."""
    for c, tree in variables.items():
        if c != "params" and jax.tree_util.tree_leaves(tree):
            raise ValueError(f"canonical weights cover Conv and Dense params only; the model has "
                             f"a {c!r} collection")
    leaves = {}
    for path, leaf in flatten_dict(unfreeze(variables.get("params", {}))).items():
        name = "/".join(path)
        if path[-1] not in ("kernel", "bias") or np.ndim(leaf) not in (1, 2, 4):
            raise ValueError(f"canonical weights cover Conv and Dense only; {name!r} is not a "
                             f"kernel or bias")
        leaves[name] = leaf
    return leaves


def get_canonical_weights(variables: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Weights as {"<module>/<kernel|bias>": array} in Keras layout (HWIO, NHWC-flatten rows).

    Flax already stores Conv kernels HWIO and Dense kernels (in, out), and a Flax model flattens
    NHWC feature maps in (h, w, c) order, so the mapping is the identity on names and layouts."""
    return {k: np.array(v) for k, v in _canonical_leaves(variables).items()}


def set_canonical_weights(variables: Mapping[str, Any], weights: Mapping[str, np.ndarray]
                          ) -> dict[str, Any] | FrozenDict:
    """New variables with the named weights replaced; each must match one leaf in shape."""
    leaves = _canonical_leaves(variables)
    unknown = set(weights) - set(leaves)
    if unknown:
        raise KeyError(f"weights not in the model: {sorted(unknown)}")
    params = flatten_dict(unfreeze(variables["params"]))
    for key, value in weights.items():
        value = np.asarray(value)
        old = leaves[key]
        if tuple(value.shape) != tuple(old.shape):
            raise ValueError(f"{key}: shape {value.shape} does not fit the model's "
                             f"{tuple(old.shape)}")
        params[tuple(key.split("/"))] = jnp.asarray(value, dtype=old.dtype)
    out = {**unfreeze(variables), "params": unflatten_dict(params)}
    return freeze(out) if isinstance(variables, FrozenDict) else out
