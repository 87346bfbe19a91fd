"""The small CNN in Keras: Conv2D (bias) -> BatchNormalization (momentum 0.9, epsilon 1e-3) ->
ReLU -> MaxPooling2D, twice, then Flatten -> Dense -> softmax (float32)."""

from __future__ import annotations

import keras
from keras import layers

from models import ModelSpec
from models.keras_common import channel_axis, input_layer
from models.small_cnn.spec import BN_EPSILON, BN_MOMENTUM, FILTERS


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    """The small CNN for spec.input_shape and spec.num_classes."""
    axis = channel_axis(data_format)
    inputs = input_layer(spec.input_shape, data_format)
    x = inputs
    for i, filters in enumerate(FILTERS, start=1):
        x = layers.Conv2D(filters, 3, padding="same", data_format=data_format,
                          name=f"conv{i}")(x)
        x = layers.BatchNormalization(axis=axis, momentum=BN_MOMENTUM, epsilon=BN_EPSILON,
                                      name=f"bn{i}")(x)
        x = layers.Activation("relu", name=f"relu{i}")(x)
        x = layers.MaxPooling2D(2, data_format=data_format, name=f"pool{i}")(x)
    x = layers.Flatten(data_format=data_format, name="flatten")(x)
    x = layers.Dense(spec.num_classes, name="fc")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="small_cnn")
