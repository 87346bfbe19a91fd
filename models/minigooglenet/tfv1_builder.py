"""MiniGoogLeNet in a tf.compat.v1 graph (tensorpack's towers), layer for layer the Keras builder:
conv modules are Conv2D (with bias) -> BatchNorm (Keras defaults: momentum 0.99, eps 1e-3) ->
ReLU; variables come from tf.compat.v1.get_variable, named "<keras layer>/<keras weight>"
(e.g. "stem_conv/kernel", "stem_bn/moving_mean"), so tensorpack's variable scopes and tower
prefixes apply to them."""

from __future__ import annotations

import tensorflow as tf

from models import ModelSpec, tfv1_common
from models.minigooglenet.spec import LAYOUT

tfv1 = tf.compat.v1
BN_MOMENTUM, BN_EPSILON = 0.99, 1e-3


def build(spec: ModelSpec, images: tf.Tensor, training: bool = True,
          data_format: str = "channels_last", update_stats: bool = True) -> tf.Tensor:
    """Logits (softmax is left to the loss) for a batch of 32x32x3 `images`.

    training: batch statistics and dropout; update_stats: also update BatchNorm's moving
    statistics in this tower (tensorpack's convention is the main training tower only)."""
    nhwc = data_format == "channels_last"
    fmt, axis = ("NHWC", 3) if nhwc else ("NCHW", 1)

    def conv(x, filters: int, k: int, stride: int, name: str, padding: str = "SAME"):
        with tfv1.variable_scope(name):
            kernel = tfv1.get_variable("kernel", [k, k, int(x.shape[axis]), filters],
                                       initializer=tfv1.glorot_uniform_initializer())
            bias = tfv1.get_variable("bias", [filters], initializer=tfv1.zeros_initializer())
        y = tf.nn.conv2d(x, kernel, stride, padding, data_format=fmt)
        return tf.nn.bias_add(y, bias, data_format=fmt)

    def batch_norm(x, name: str):
        return tfv1_common.batch_norm(x, name, data_format=data_format, training=training,
                                      update_stats=update_stats, momentum=BN_MOMENTUM,
                                      epsilon=BN_EPSILON)

    def conv_module(x, filters: int, k: int, stride: int, name: str, padding: str = "SAME"):
        x = conv(x, filters, k, stride, f"{name}_conv", padding)
        return tf.nn.relu(batch_norm(x, f"{name}_bn"))

    def pool(x, fn, k: int, stride: int):
        return fn(x, k, stride, "VALID", data_format=fmt)

    x = conv_module(images, 96, 3, 1, "stem")
    for i, (a, b) in enumerate(LAYOUT, start=1):
        if a == "down":
            x = tf.concat([conv_module(x, b, 3, 2, f"down{i}_3x3", padding="VALID"),
                           pool(x, tf.nn.max_pool2d, 3, 2)], axis)
        else:
            x = tf.concat([conv_module(x, a, 1, 1, f"incep{i}_1x1"),
                           conv_module(x, b, 3, 1, f"incep{i}_3x3")], axis)
    x = pool(x, tf.nn.avg_pool2d, 7, 7)
    if training:
        x = tf.nn.dropout(x, rate=0.5)
    return tfv1_common.dense(tfv1_common.flatten_nhwc(x, nhwc), spec.num_classes, "fc")
