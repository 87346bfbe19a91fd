"""The probe model in a tf.compat.v1 graph (tensorpack's towers): conv 3x3x4 same + bias + ReLU,
flatten, dense 10. Variables come from tf.compat.v1.get_variable under the canonical names
("conv/kernel", "conv/bias", "dense/kernel", "dense/bias") in Keras layout, so a variable-scope
reuse or a tower prefix ("tower1/conv/kernel") works as tensorpack expects."""

from __future__ import annotations

import tensorflow as tf

from models import ModelSpec
from models.tfv1_common import dense, flatten_nhwc

tfv1 = tf.compat.v1


def build(spec: ModelSpec, images: tf.Tensor, training: bool = True,
          data_format: str = "channels_last", update_stats: bool = True) -> tf.Tensor:
    """Logits of the probe for NHWC (or NCHW) `images`; softmax is left to the loss.
    `training` and `update_stats` are accepted for a uniform builder signature (no BatchNorm)."""
    del training, update_stats
    nhwc = data_format == "channels_last"
    cin = images.shape[-1] if nhwc else images.shape[1]
    with tfv1.variable_scope("conv"):
        kernel = tfv1.get_variable("kernel", [3, 3, cin, 4],
                                   initializer=tfv1.glorot_uniform_initializer())
        bias = tfv1.get_variable("bias", [4], initializer=tfv1.zeros_initializer())
    fmt = "NHWC" if nhwc else "NCHW"
    x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(images, kernel, 1, "SAME", data_format=fmt),
                                  bias, data_format=fmt))
    # the dense kernel's rows are in NHWC flatten order (canonical layout)
    return dense(flatten_nhwc(x, nhwc), spec.num_classes, "dense")
