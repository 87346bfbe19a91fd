"""Keras helpers for the Keras builders, the child runners and the parity test.

Imports keras: never import this module from the parent process.
"""

from __future__ import annotations

from collections.abc import Iterator

import keras
import numpy as np


def channel_axis(data_format: str) -> int:
    """The channel axis (for BatchNormalization and Concatenate) of a data format."""
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"data_format must be channels_last or channels_first: {data_format!r}")
    return -1 if data_format == "channels_last" else 1


def input_layer(shape_hwc: tuple[int, int, int], data_format: str) -> keras.KerasTensor:
    """The model input named "image": (H, W, C) for channels_last, (C, H, W) for channels_first."""
    h, w, c = shape_hwc
    shape = (h, w, c) if channel_axis(data_format) == -1 else (c, h, w)
    return keras.Input(shape, name="image")


def _leaf_layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """The model's layers, nested models expanded."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _leaf_layers(layer)
        else:
            yield layer


def count_params_keras(model: keras.Model) -> int:
    """Every weight, trainable or not (BatchNorm moving statistics included)."""
    return int(sum(np.prod(w.shape) for w in model.weights))


def count_trainable_keras(model: keras.Model) -> int:
    """Trainable weights only."""
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def count_flops_keras(model: keras.Model) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv2D and Dense layers (bias ignored)."""
    flops = 0
    for layer in _leaf_layers(model):
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            out = layer.output.shape
            hw = out[1] * out[2] if layer.data_format == "channels_last" else out[2] * out[3]
            flops += 2 * kh * kw * cin * cout * hw
        elif isinstance(layer, keras.layers.Dense):
            cin, cout = layer.kernel.shape
            flops += 2 * cin * cout
    return int(flops)


def _named_variables(model: keras.Model) -> Iterator[tuple[str, keras.Variable]]:
    """("<layer name>/<variable name>", variable) for every weight, e.g. "conv/kernel"."""
    for layer in _leaf_layers(model):
        for var in layer.weights:
            yield f"{layer.name}/{var.name.split('/')[-1]}", var


def get_canonical_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """Weights as {"<layer>/<kernel|bias>": array} (Keras layout: HWIO kernels)."""
    return {key: np.array(var.numpy()) for key, var in _named_variables(model)}


def set_canonical_weights(model: keras.Model, weights: dict[str, np.ndarray]) -> None:
    """Assign weights named as get_canonical_weights names them; each must match one variable."""
    unused = set(weights)
    for key, var in _named_variables(model):
        if key in weights:
            value = np.asarray(weights[key])
            if tuple(value.shape) != tuple(var.shape):
                raise ValueError(f"{key}: shape {value.shape}, model has {tuple(var.shape)}")
            var.assign(value.astype(var.dtype))
            unused.discard(key)
    if unused:
        raise KeyError(f"weights not in the model: {sorted(unused)}")
