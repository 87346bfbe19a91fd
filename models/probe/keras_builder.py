"""The probe model in Keras: conv -> ReLU -> flatten -> dense -> softmax, no BatchNorm or
dropout, so one SGD step is deterministic and the same on 1 or N devices."""

from __future__ import annotations

import keras
from keras import layers

from models import ModelSpec
from models.keras_common import input_layer


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    """The probe; layer names "conv" and "dense" are its canonical weight names."""
    inputs = input_layer(spec.input_shape, data_format)
    x = layers.Conv2D(4, 3, padding="same", activation="relu", data_format=data_format,
                      name="conv")(inputs)
    # Flatten(channels_first) flattens in NHWC order, so the dense kernel keeps one layout.
    x = layers.Flatten(data_format=data_format, name="flatten")(x)
    x = layers.Dense(spec.num_classes, name="dense")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="probe")
