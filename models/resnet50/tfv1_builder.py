"""ResNet-50 v1.5 in a tf.compat.v1 graph (tensorpack's towers), layer for layer the Keras
builder (torchvision's resnet50): stride on the 3x3 bottleneck conv, no conv bias, BatchNorm
(momentum 0.9, eps 1e-5) after every conv, symmetric zero padding before strided convs and the
stem's max pool. Variables come from tf.compat.v1.get_variable, named "<keras layer>/<keras
weight>" (e.g. "res2a_b_conv/kernel"), so tensorpack's variable scopes and tower prefixes apply."""

from __future__ import annotations

import tensorflow as tf

from models import ModelSpec, tfv1_common
from models.resnet50.spec import STAGES

tfv1 = tf.compat.v1
BN_MOMENTUM, BN_EPSILON = 0.9, 1e-5


def build(spec: ModelSpec, images: tf.Tensor, training: bool = True,
          data_format: str = "channels_last", update_stats: bool = True) -> tf.Tensor:
    """Logits (softmax is left to the loss) for a batch of 224x224x3 `images`.

    training: batch statistics; update_stats: also update BatchNorm's moving statistics in this
    tower (tensorpack's convention is the main training tower only)."""
    nhwc = data_format == "channels_last"
    fmt, axis = ("NHWC", 3) if nhwc else ("NCHW", 1)

    def pad(x, p: int):
        spatial = [[0, 0], [p, p], [p, p], [0, 0]] if nhwc else [[0, 0], [0, 0], [p, p], [p, p]]
        return tf.pad(x, spatial)

    def batch_norm(x, name: str):
        return tfv1_common.batch_norm(x, name, data_format=data_format, training=training,
                                      update_stats=update_stats, momentum=BN_MOMENTUM,
                                      epsilon=BN_EPSILON)

    def conv_bn(x, filters: int, k: int, stride: int, name: str, relu: bool = True):
        padding = "SAME"
        if stride > 1 and k > 1:  # "same" would pad asymmetrically; PyTorch pads k // 2 each side
            x, padding = pad(x, k // 2), "VALID"
        with tfv1.variable_scope(f"{name}_conv"):
            kernel = tfv1.get_variable("kernel", [k, k, int(x.shape[axis]), filters],
                                       initializer=tfv1.glorot_uniform_initializer())
        x = batch_norm(tf.nn.conv2d(x, kernel, stride, padding, data_format=fmt), f"{name}_bn")
        return tf.nn.relu(x) if relu else x

    def bottleneck(x, width: int, stride: int, name: str, project: bool):
        shortcut = conv_bn(x, width * 4, 1, stride, f"{name}_proj", relu=False) if project else x
        y = conv_bn(x, width, 1, 1, f"{name}_a")
        y = conv_bn(y, width, 3, stride, f"{name}_b")  # v1.5: the stride is here, not on _a
        y = conv_bn(y, width * 4, 1, 1, f"{name}_c", relu=False)
        return tf.nn.relu(shortcut + y)

    x = conv_bn(images, 64, 7, 2, "stem")
    x = tf.nn.max_pool2d(pad(x, 1), 3, 2, "VALID", data_format=fmt)
    for s, (width, blocks, stride) in enumerate(STAGES, start=2):
        for b in range(blocks):
            x = bottleneck(x, width, stride if b == 0 else 1, f"res{s}{chr(97 + b)}", b == 0)
    x = tf.reduce_mean(x, [1, 2] if nhwc else [2, 3])
    return tfv1_common.dense(x, spec.num_classes, "fc")
