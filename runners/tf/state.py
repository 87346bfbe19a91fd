"""The model state each device holds under tf.distribute, summed from the distributed
variables' per-device components (parameters, optimizer state, gradients as the trainable
weights). Child side: imports TensorFlow and Keras. docs/runners/tf_family.md."""

from __future__ import annotations

import math
from typing import Any

from contract.reasons import code
from runners.memory import _itemsize
from runners.tf.placement import device_key


def _per_device(variables: Any) -> dict[str, int]:
    """Bytes each device holds of `variables`: a distributed variable's per-device values."""
    held: dict[str, int] = {}
    for v in variables:
        inner = getattr(v, "value", v)  # a Keras 3 Variable -> the tf variable
        values = getattr(inner, "values", None)
        for part in (values if values is not None else [inner]):
            nbytes = math.prod(int(d) for d in part.shape) * _itemsize(part.dtype)
            key = device_key(part.device)
            held[key] = held.get(key, 0) + nbytes
    return held


def _whole(variables: Any) -> int:
    return sum(math.prod(int(d) for d in v.shape) * _itemsize(v.dtype) for v in variables)


def state_bytes_tf(model: Any) -> dict[str, Any]:
    """state_bytes_per_device, state_bytes_global and state_source of a Keras model trained
    under a tf.distribute strategy (its optimizer: model.optimizer)."""
    optimizer = getattr(model, "optimizer", None)
    opt_vars = list(getattr(optimizer, "variables", None) or ())
    params, grads = _per_device(model.weights), _per_device(model.trainable_weights)
    opt = _per_device(opt_vars)
    devices = sorted(set(params) | set(opt))
    return {
        "state_bytes_per_device": {d: {"params": params.get(d, 0), "grads": grads.get(d, 0),
                                       "optimizer": opt.get(d, 0)} for d in devices},
        "state_bytes_global": {"params": _whole(model.weights),
                               "grads": _whole(model.trainable_weights),
                               "optimizer": _whole(opt_vars)},
        "state_source": code("tf.distributed_variables_state"),
    }


def keras_policy(model: Any, precision: str) -> dict[str, Any]:
    """The record's precision_policy of a compiled Keras 3 model, read back from it (dtype policy,
    variables' dtype, loss scaling; gradients reduced in the trainable variables' dtype)."""
    from contract.precision_policy import resolve

    policy = model.dtype_policy
    optimizer = getattr(model, "optimizer", None)
    scaled = type(optimizer).__name__ == "LossScaleOptimizer"
    variable = model.trainable_weights[0].dtype if model.trainable_weights else None
    return {"precision_policy": resolve(
        precision, how=f"keras dtype policy {policy.name!r} (keras.mixed_precision)"
        + ("; compile's LossScaleOptimizer" if scaled else ""),
        compute=policy.compute_dtype, params=variable or policy.variable_dtype,
        reduce=variable or policy.variable_dtype,
        loss_scaling="dynamic" if scaled else None)}
