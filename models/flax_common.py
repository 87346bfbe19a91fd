"""JAX/Flax helpers for the flax builders, the child runners and the parity test.

Imports jax and flax: never import this module from the parent process.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.core import FrozenDict, freeze, unfreeze
from flax.traverse_util import flatten_dict, unflatten_dict

if TYPE_CHECKING:
    from models import ModelSpec

# Collections counted as model weights: trainable params and BatchNorm running mean/var.
WEIGHT_COLLECTIONS = ("params", "batch_stats")


def check_data_format(data_format: str) -> None:
    """Raise ValueError unless data_format is channels_last (the only layout a Flax model takes)."""
    if data_format != "channels_last":
        # XLA chooses the physical layout itself; NCHW input would only add transposes.
        raise ValueError(f"data_format must be channels_last for Flax models (NHWC input; XLA "
                         f"picks the physical layout): {data_format!r}")


def flatten_dense(x: jax.Array, num_classes: int, dtype: Any, name: str = "fc") -> jax.Array:
    """x flattened per sample (NHWC order, as Keras' Flatten) into a Dense of num_classes
    logits with Keras' initialisers (glorot_uniform kernel, zero bias); called inside a
    module's compact method, it is that module's submodule `name`."""
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(num_classes, kernel_init=nn.initializers.glorot_uniform(), dtype=dtype,
                    name=name)(x)


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


# What describe() says of its FLOPs.
XLA_FLOPS_SOURCE = "XLA cost analysis of the jitted forward (batch 1)"


def input_struct(model_spec: ModelSpec, batch: int) -> jax.ShapeDtypeStruct:
    """A batch of the model's input as a shape: int32 token ids (batch, seq_len) for a token
    model, float32 NHWC images (batch, H, W, C) otherwise."""
    if model_spec.input_kind == "tokens":
        return jax.ShapeDtypeStruct((batch, *model_spec.input_shape), jnp.int32)
    return jax.ShapeDtypeStruct((batch, *model_spec.input_shape), jnp.float32)


def takes_train(model: nn.Module) -> bool:
    """Whether the module's __call__ takes a `train` argument (the built-in models do; a user's
    module may not, and is then called with the input alone)."""
    try:
        params = inspect.signature(model.__call__).parameters
    except (TypeError, ValueError):
        return False
    return "train" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD
                                    for p in params.values())


def train_kwargs(model: nn.Module, train: bool) -> dict[str, Any]:
    """{"train": train} for a module that takes it, {} for one that does not."""
    return {"train": train} if takes_train(model) else {}


INIT_RNGS = ("params", "dropout")  # init's rng streams (a user's dropout may ask at init)


def init_rngs(seed: int = 0) -> dict[str, jax.Array]:
    """The rngs init is given: "params" from `seed`, "dropout" from seed + 1."""
    return {name: jax.random.key(seed + i) for i, name in enumerate(INIT_RNGS)}


def describe(model: Any, model_spec: ModelSpec) -> dict[str, Any]:
    """What JAX says of a Flax (linen) model, built-in or a user's, without allocating its
    weights: params and trainable_params from init under jax.eval_shape (every collection of
    weights counted, "params" alone trainable); flops_per_sample from XLA's cost analysis of the
    jitted forward (eval mode) compiled for a batch of 1 (XLA counts a dot or a conv as 2 x its
    multiply-adds, plus one per element of the element-wise ops); output_shape for a batch of
    2. Raises models.custom.CustomModelError when `model` is not a flax.linen.Module, or (a
    user's model) when init or the forward pass fails on the declared input."""
    from models.custom import CustomModelError, not_a_model_of

    if not isinstance(model, nn.Module):
        raise not_a_model_of(model_spec, model,
                          "a flax.linen.Module")
    kwargs = train_kwargs(model, False)
    one, two = input_struct(model_spec, 1), input_struct(model_spec, 2)

    def forward(variables: Any, x: jax.Array) -> Any:
        return model.apply(variables, x, **kwargs)

    try:
        variables = jax.eval_shape(lambda x: model.init(init_rngs(), x, **kwargs), one)
        out = jax.eval_shape(forward, variables, two)
        cost = jax.jit(forward).lower(variables, one).compile().cost_analysis()
    except Exception as exc:
        if model_spec.workload != "custom":
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CustomModelError(
            f"models: {model_spec.name}: the forward pass on input {list(one.shape)} "
            f"{one.dtype} failed: {type(exc).__name__}: {first}") from None
    if isinstance(cost, list | tuple):  # older jax: one dict per program
        cost = cost[0]
    shape = getattr(out, "shape", None)
    if shape is None:
        raise CustomModelError(f"models: {model_spec.name}: the model returned "
                               f"{type(out).__name__}, not one logits array")
    variables = unfreeze(variables) if isinstance(variables, FrozenDict) else variables
    return {"params": count_params_flax(variables),
            "trainable_params": count_trainable_flax(variables),
            "flops_per_sample": int(cost["flops"]),
            "flops_source": XLA_FLOPS_SOURCE,
            "output_shape": [int(v) for v in shape]}
