"""ResNet-50 v1.5 in Keras, layer for layer torchvision's resnet50: bottleneck blocks with the
stride on the 3x3 conv, no conv bias, BatchNorm (eps 1e-5, momentum 0.9) after every conv, and
symmetric zero padding before strided convs and the stem's max pool, as PyTorch pads."""

from __future__ import annotations

import keras
from keras import layers

from models import ModelSpec
from models.keras_common import channel_axis, input_layer
from models.resnet50.spec import STAGES


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    """ResNet-50 v1.5 for spec.input_shape (224x224x3) and spec.num_classes."""
    axis = channel_axis(data_format)

    def conv_bn(x, filters: int, k: int, stride: int, name: str, relu: bool = True):
        padding = "same"
        if stride > 1 and k > 1:  # "same" would pad asymmetrically; PyTorch pads k // 2 each side
            x = layers.ZeroPadding2D(k // 2, data_format=data_format, name=f"{name}_pad")(x)
            padding = "valid"
        x = layers.Conv2D(filters, k, strides=stride, padding=padding, use_bias=False,
                          data_format=data_format, name=f"{name}_conv")(x)
        x = layers.BatchNormalization(axis=axis, epsilon=1e-5, momentum=0.9,
                                      name=f"{name}_bn")(x)
        return layers.Activation("relu", name=f"{name}_relu")(x) if relu else x

    def bottleneck(x, width: int, stride: int, name: str, project: bool):
        shortcut = conv_bn(x, width * 4, 1, stride, f"{name}_proj", relu=False) if project else x
        y = conv_bn(x, width, 1, 1, f"{name}_a")
        y = conv_bn(y, width, 3, stride, f"{name}_b")  # v1.5: the stride is here, not on _a
        y = conv_bn(y, width * 4, 1, 1, f"{name}_c", relu=False)
        y = layers.Add(name=f"{name}_add")([shortcut, y])
        return layers.Activation("relu", name=f"{name}_out")(y)

    inputs = input_layer(spec.input_shape, data_format)
    x = conv_bn(inputs, 64, 7, 2, "stem")
    x = layers.ZeroPadding2D(1, data_format=data_format, name="stem_pool_pad")(x)
    x = layers.MaxPooling2D(3, strides=2, data_format=data_format, name="stem_pool")(x)
    for s, (width, blocks, stride) in enumerate(STAGES, start=2):
        for b in range(blocks):
            x = bottleneck(x, width, stride if b == 0 else 1, f"res{s}{chr(97 + b)}", b == 0)
    x = layers.GlobalAveragePooling2D(data_format=data_format, name="avg_pool")(x)
    x = layers.Dense(spec.num_classes, name="fc")(x)
    outputs = layers.Activation("softmax", dtype="float32", name="softmax")(x)
    return keras.Model(inputs, outputs, name="resnet50")
