"""MiniGoogLeNet in Keras, as in seed 004 (conv -> BN -> ReLU modules; conv layers keep their
bias, as the original Keras code does)."""

from __future__ import annotations

import keras
from keras import layers

from models import ModelSpec
from models.keras_common import channel_axis, input_layer


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    axis = channel_axis(data_format)
    count = iter(range(1, 1000))

    def conv(x, filters: int, k: int, stride: int, padding: str = "same"):
        i = next(count)
        x = layers.Conv2D(filters, k, strides=stride, padding=padding, data_format=data_format,
                          name=f"conv{i}")(x)
        x = layers.BatchNormalization(axis=axis, name=f"bn{i}")(x)
        return layers.Activation("relu", name=f"relu{i}")(x)

    def inception(x, k1: int, k3: int):
        return layers.Concatenate(axis=axis)([conv(x, k1, 1, 1), conv(x, k3, 3, 1)])

    def downsample(x, k: int):
        pool = layers.MaxPooling2D(3, strides=2, data_format=data_format)(x)
        return layers.Concatenate(axis=axis)([conv(x, k, 3, 2, "valid"), pool])

    inputs = input_layer(spec.input_shape, data_format)
    x = conv(inputs, 96, 3, 1)
    x = inception(x, 32, 32)
    x = inception(x, 32, 48)
    x = downsample(x, 80)
    for k1, k3 in ((112, 48), (96, 64), (80, 80), (48, 96)):
        x = inception(x, k1, k3)
    x = downsample(x, 96)
    x = inception(x, 176, 160)
    x = inception(x, 176, 160)
    x = layers.AveragePooling2D(7, data_format=data_format)(x)
    x = layers.Dropout(0.5)(x)
    x = layers.Flatten(data_format=data_format)(x)
    x = layers.Dense(spec.num_classes, name="fc")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="minigooglenet")
