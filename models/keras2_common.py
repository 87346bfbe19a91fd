"""Keras 2 helpers (keras-mxnet 2.2 for the keras_mxnet runner and the MXNet parity test; tf_keras
for the Keras 2 tower runners, runners/tf/towers.py): parameter counts, FLOPs and the
probe's canonical weights, as models.keras_common has them.

Imports keras lazily, inside the functions: callers make a Keras 2 the `keras` module first
(runners.mxnet.common.import_keras_mxnet, runners.tf.towers), never the parent process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def _keras() -> Any:
    """The keras module the caller already imported (keras-mxnet)."""
    import keras

    return keras


def _leaf_layers(model: Any) -> Iterator[Any]:
    """The model's layers, nested models expanded."""
    keras = _keras()
    # keras-mxnet (Keras 2.2) nests Networks; tf_keras (Keras 2.x for TF) has no keras.engine
    engine = getattr(keras, "engine", None)
    network = engine.network.Network if engine is not None else keras.Model
    for layer in model.layers:
        if isinstance(layer, network):
            yield from _leaf_layers(layer)
        else:
            yield layer


def _size(var: Any) -> int:
    return int(np.prod(_keras().backend.int_shape(var)))


def count_params_keras2(model: Any) -> int:
    """Every weight, trainable or not (BatchNorm moving statistics included)."""
    return sum(_size(w) for w in model.weights)


def count_trainable_keras2(model: Any) -> int:
    """Trainable weights only."""
    return sum(_size(w) for w in model.trainable_weights)


def count_flops_keras2(model: Any) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv2D and Dense layers (bias ignored)."""
    layers = _keras().layers
    flops = 0
    for layer in _leaf_layers(model):
        if isinstance(layer, layers.Conv2D):
            # kh * kw * cin * cout whatever the kernel's layout (keras-mxnet's is OIHW in NCHW)
            out = layer.output_shape
            hw = out[1] * out[2] if layer.data_format == "channels_last" else out[2] * out[3]
            flops += 2 * _size(layer.kernel) * hw
        elif isinstance(layer, layers.Dense):
            flops += 2 * _size(layer.kernel)
    return int(flops)


def _oihw(layer: Any) -> bool:
    """Whether a layer's kernel is OIHW: keras-mxnet's Conv2D stores it so in channels_first."""
    keras = _keras()
    return (isinstance(layer, keras.layers.Conv2D) and layer.data_format == "channels_first"
            and keras.backend.backend() == "mxnet")


def _named_variables(model: Any) -> Iterator[tuple[str, Any, Any]]:
    """("<layer>/<kernel|bias|...>", layer, variable) for every weight, e.g. "conv/kernel"."""
    for layer in _leaf_layers(model):
        for var in layer.weights:
            # keras-mxnet names variables "conv/kernel1": a global counter follows the name.
            short = var.name.split("/")[-1].split(":")[0].rstrip("0123456789")
            yield f"{layer.name}/{short}", layer, var


def get_canonical_weights(model: Any) -> dict[str, np.ndarray]:
    """Weights as {"<layer>/<kernel|bias>": array} in Keras layout (HWIO conv kernels).

    Keras 2.2's Flatten(channels_first) flattens in NHWC order, so dense kernels need no change.
    Values come from model.get_weights(): after training, keras-mxnet's variables only see the
    MXNet Module's updated parameters through it (get_value on a variable reads a stale copy)."""
    current = {id(var): value for var, value in zip(model.weights, model.get_weights(),
                                                    strict=True)}
    out = {}
    for key, layer, var in _named_variables(model):
        value = np.array(current[id(var)])
        if _oihw(layer) and var is layer.kernel:
            value = value.transpose(2, 3, 1, 0)
        out[key] = value
    return out


def set_canonical_weights(model: Any, weights: dict[str, np.ndarray]) -> None:
    """Assign weights named as get_canonical_weights names them; each must match one variable."""
    backend = _keras().backend
    unused = set(weights)
    for key, layer, var in _named_variables(model):
        if key in weights:
            value = np.asarray(weights[key])
            if _oihw(layer) and var is layer.kernel:
                value = value.transpose(3, 2, 0, 1)
            if tuple(value.shape) != tuple(backend.int_shape(var)):
                raise ValueError(f"{key}: shape {np.shape(weights[key])} in the model's layout is "
                                 f"{value.shape}, model has {backend.int_shape(var)}")
            backend.set_value(var, value.astype(backend.dtype(var)))
            unused.discard(key)
    if unused:
        raise KeyError(f"weights not in the model: {sorted(unused)}")
