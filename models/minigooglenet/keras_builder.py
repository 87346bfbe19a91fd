"""MiniGoogLeNet in Keras, as PyImageSearch's `MiniGoogLeNet.build` (seed 004): conv modules are
Conv2D (with its default bias) -> BatchNorm -> ReLU, as in the original Keras code."""

from __future__ import annotations

import keras
from keras import layers

from models import ModelSpec
from models.keras_common import channel_axis, input_layer
from models.minigooglenet.spec import LAYOUT


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    """MiniGoogLeNet for spec.input_shape (32x32x3) and spec.num_classes."""
    axis = channel_axis(data_format)

    def conv_module(x, filters: int, k: int, stride: int, name: str, padding: str = "same"):
        x = layers.Conv2D(filters, k, strides=stride, padding=padding, data_format=data_format,
                          name=f"{name}_conv")(x)
        x = layers.BatchNormalization(axis=axis, name=f"{name}_bn")(x)
        return layers.Activation("relu", name=f"{name}_relu")(x)

    def inception_module(x, k1: int, k3: int, name: str):
        a = conv_module(x, k1, 1, 1, f"{name}_1x1")
        b = conv_module(x, k3, 3, 1, f"{name}_3x3")
        return layers.Concatenate(axis=axis, name=f"{name}_concat")([a, b])

    def downsample_module(x, k: int, name: str):
        a = conv_module(x, k, 3, 2, f"{name}_3x3", padding="valid")
        b = layers.MaxPooling2D(3, strides=2, data_format=data_format, name=f"{name}_pool")(x)
        return layers.Concatenate(axis=axis, name=f"{name}_concat")([a, b])

    inputs = input_layer(spec.input_shape, data_format)
    x = conv_module(inputs, 96, 3, 1, "stem")
    for i, (a, b) in enumerate(LAYOUT, start=1):
        x = downsample_module(x, b, f"down{i}") if a == "down" else inception_module(
            x, a, b, f"incep{i}")
    x = layers.AveragePooling2D(7, data_format=data_format, name="avg_pool")(x)
    x = layers.Dropout(0.5, name="dropout")(x)
    x = layers.Flatten(data_format=data_format, name="flatten")(x)
    x = layers.Dense(spec.num_classes, name="fc")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="minigooglenet")
