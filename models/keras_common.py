"""Keras helpers shared by the Keras builders and runners (child processes only)."""

from __future__ import annotations

import keras
import numpy as np


def channel_axis(data_format: str) -> int:
    return -1 if data_format == "channels_last" else 1


def input_layer(shape_hwc: tuple[int, int, int], data_format: str) -> keras.KerasTensor:
    h, w, c = shape_hwc
    return keras.Input((h, w, c) if data_format == "channels_last" else (c, h, w), name="image")


def count_params_keras(model: keras.Model) -> int:
    """Every weight, trainable or not (BatchNorm moving statistics included)."""
    return int(sum(np.prod(w.shape) for w in model.weights))


def count_trainable_keras(model: keras.Model) -> int:
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def count_flops_keras(model: keras.Model) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv2D and Dense layers."""
    flops = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            out = layer.output.shape
            spatial = out[1] * out[2] if layer.data_format == "channels_last" else out[2] * out[3]
            flops += 2 * kh * kw * cin * cout * spatial
        elif isinstance(layer, keras.layers.Dense):
            cin, cout = layer.kernel.shape
            flops += 2 * cin * cout
    return int(flops)


def get_canonical_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """Weights as {"<layer>/<kernel|bias>": array} for layers that have them."""
    found = {}
    for layer in model.layers:
        for var in layer.weights:
            found[f"{layer.name}/{var.name.split('/')[-1]}"] = np.asarray(var.numpy())
    return found


def set_canonical_weights(model: keras.Model, weights: dict[str, np.ndarray]) -> None:
    """Assign weights named as get_canonical_weights names them; every one must be used."""
    missing = set(weights)
    for layer in model.layers:
        for var in layer.weights:
            key = f"{layer.name}/{var.name.split('/')[-1]}"
            if key in weights:
                var.assign(weights[key])
                missing.discard(key)
    if missing:
        raise KeyError(f"weights not in the model: {sorted(missing)}")
