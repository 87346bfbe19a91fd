"""MiniGoogLeNet in Gluon, layer for layer the Keras builder (PyImageSearch, seed 004): conv
modules are Conv2D with bias -> BatchNorm (Keras' defaults: eps 1e-3, momentum 0.99) -> ReLU.
Returns logits; the loss applies softmax."""

from __future__ import annotations

from mxnet.gluon import nn
from mxnet.gluon.contrib.nn import HybridConcurrent

from models import ModelSpec
from models.minigooglenet.spec import LAYOUT


def conv_module(cin: int, cout: int, k: int, stride: int, padding: int,
                prefix: str) -> nn.HybridSequential:
    """Conv (with bias) -> BatchNorm -> ReLU."""
    seq = nn.HybridSequential(prefix=prefix)
    with seq.name_scope():
        seq.add(nn.Conv2D(cout, k, strides=stride, padding=padding, in_channels=cin,
                          prefix="conv_"),
                nn.BatchNorm(momentum=0.99, epsilon=1e-3, in_channels=cout, prefix="bn_"),
                nn.Activation("relu", prefix="relu_"))
    return seq


def inception_module(cin: int, k1: int, k3: int, prefix: str) -> HybridConcurrent:
    """Concatenated channels of a 1x1 and a 3x3 "same" conv module: k1 + k3 channels."""
    cat = HybridConcurrent(axis=1, prefix=prefix)
    with cat.name_scope():
        cat.add(conv_module(cin, k1, 1, 1, 0, "1x1_"), conv_module(cin, k3, 3, 1, 1, "3x3_"))
    return cat


def downsample_module(cin: int, k: int, prefix: str) -> HybridConcurrent:
    """Concatenated 3x3/2 "valid" conv module and 3x3/2 max pool: k + cin channels."""
    cat = HybridConcurrent(axis=1, prefix=prefix)
    with cat.name_scope():
        cat.add(conv_module(cin, k, 3, 2, 0, "3x3_"), nn.MaxPool2D(3, strides=2, prefix="pool_"))
    return cat


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.HybridSequential:
    """MiniGoogLeNet for NCHW spec.input_shape (32x32x3) and spec.num_classes: logits."""
    if data_format != "channels_first":
        raise ValueError(f"Gluon convolutions are channels_first (NCHW): {data_format!r}")
    net = nn.HybridSequential(prefix="minigooglenet_")
    with net.name_scope():
        net.add(conv_module(spec.input_shape[2], 96, 3, 1, 1, "stem_"))
        cin = 96
        for i, (a, b) in enumerate(LAYOUT, start=1):
            if a == "down":
                net.add(downsample_module(cin, b, f"down{i}_"))
                cin += b
            else:
                net.add(inception_module(cin, a, b, f"incep{i}_"))
                cin = a + b
        net.add(nn.AvgPool2D(7, prefix="avg_pool_"), nn.Dropout(0.5, prefix="dropout_"),
                nn.Flatten(prefix="flatten_"), nn.Dense(spec.num_classes, in_units=cin,
                                                        prefix="fc_"))
    return net
