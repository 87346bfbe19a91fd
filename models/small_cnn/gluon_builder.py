"""The small CNN in Gluon, layer for layer the Keras and torch builders: Conv2D (bias) ->
BatchNorm (eps 1e-3, momentum 0.9: Gluon's momentum has Keras' meaning, moving = 0.9 x moving
+ 0.1 x batch) -> ReLU -> MaxPool2D, twice, then flatten (C x 8 x 8) -> Dense; returns logits
(the loss applies softmax). Keras' initialisers, set on the layers so they hold whatever
default initialiser net.initialize() is given: glorot_uniform kernels (MXNet's Xavier uniform,
avg fan, magnitude 3), zero biases; BatchNorm gamma 1, beta 0, moving mean 0, variance 1."""

from __future__ import annotations

import mxnet as mx
from mxnet.gluon import nn

from models import ModelSpec
from models.small_cnn.spec import BN_EPSILON, BN_MOMENTUM, FILTERS


def glorot_uniform() -> mx.init.Initializer:
    """Keras' glorot_uniform: U(+-sqrt(6 / (fan_in + fan_out))), MXNet's fans counting the
    kernel's spatial size as Keras does."""
    return mx.init.Xavier(rnd_type="uniform", factor_type="avg", magnitude=3)


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.HybridSequential:
    """The small CNN for NCHW spec.input_shape (32x32x3) and spec.num_classes: logits."""
    if data_format != "channels_first":
        raise ValueError(f"Gluon convolutions are channels_first (NCHW): {data_format!r}")
    h, w, cin = spec.input_shape
    net = nn.HybridSequential(prefix="small_cnn_")
    with net.name_scope():
        for i, filters in enumerate(FILTERS, start=1):
            net.add(nn.Conv2D(filters, 3, padding=1, in_channels=cin, prefix=f"conv{i}_",
                              weight_initializer=glorot_uniform(), bias_initializer="zeros"),
                    nn.BatchNorm(momentum=BN_MOMENTUM, epsilon=BN_EPSILON, in_channels=filters,
                                 prefix=f"bn{i}_"),
                    nn.Activation("relu", prefix=f"relu{i}_"),
                    nn.MaxPool2D(2, strides=2, prefix=f"pool{i}_"))
            cin, h, w = filters, h // 2, w // 2
        net.add(nn.Flatten(prefix="flatten_"),
                nn.Dense(spec.num_classes, in_units=cin * h * w, prefix="fc_",
                         weight_initializer=glorot_uniform(), bias_initializer="zeros"))
    # Gluon flattens in (c, h, w) order, Keras in (h, w, c): gluon_common maps the dense
    # kernel's rows between the two canonical layouts with this shape.
    net.flatten_chw = (cin, h, w)
    return net
