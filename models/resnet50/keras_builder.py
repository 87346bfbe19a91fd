"""ResNet-50 v1.5 in Keras: bottleneck blocks with the stride on the 3x3 conv, no conv bias,
BatchNorm after every conv (the torchvision and tf_cnn_benchmarks variant)."""

from __future__ import annotations

import keras
from keras import layers

from models import ModelSpec
from models.keras_common import channel_axis, input_layer

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # width, blocks, first stride


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    axis = channel_axis(data_format)

    def conv_bn(x, filters: int, k: int, stride: int, name: str, relu: bool = True):
        x = layers.Conv2D(filters, k, strides=stride, padding="same", use_bias=False,
                          data_format=data_format, name=f"{name}_conv")(x)
        x = layers.BatchNormalization(axis=axis, epsilon=1e-5, momentum=0.9,
                                      name=f"{name}_bn")(x)
        return layers.Activation("relu", name=f"{name}_relu")(x) if relu else x

    def bottleneck(x, width: int, stride: int, name: str, project: bool):
        shortcut = conv_bn(x, width * 4, 1, stride, f"{name}_proj", relu=False) if project else x
        y = conv_bn(x, width, 1, 1, f"{name}_a")
        y = conv_bn(y, width, 3, stride, f"{name}_b")  # v1.5: the stride is here
        y = conv_bn(y, width * 4, 1, 1, f"{name}_c", relu=False)
        y = layers.Add(name=f"{name}_add")([shortcut, y])
        return layers.Activation("relu", name=f"{name}_out")(y)

    inputs = input_layer(spec.input_shape, data_format)
    x = conv_bn(inputs, 64, 7, 2, "stem")
    x = layers.MaxPooling2D(3, strides=2, padding="same", data_format=data_format)(x)
    for s, (width, blocks, stride) in enumerate(STAGES, start=2):
        for b in range(blocks):
            x = bottleneck(x, width, stride if b == 0 else 1, f"res{s}{chr(97 + b)}", b == 0)
    x = layers.GlobalAveragePooling2D(data_format=data_format)(x)
    x = layers.Dense(spec.num_classes, name="fc")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="resnet50")
