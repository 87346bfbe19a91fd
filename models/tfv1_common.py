"""tf.compat.v1 graph pieces shared by the tfv1 builders (tensorpack's towers; child only)."""

from __future__ import annotations

import tensorflow as tf

tfv1 = tf.compat.v1


def batch_norm(x: tf.Tensor, name: str, *, data_format: str, training: bool,
               update_stats: bool, momentum: float, epsilon: float) -> tf.Tensor:
    """Fused BatchNorm with Keras' variable names (gamma, beta, moving_mean, moving_variance).

    training: batch statistics; update_stats: also update the moving statistics here."""
    fmt, axis = ("NHWC", 3) if data_format == "channels_last" else ("NCHW", 1)
    c = int(x.shape[axis])
    with tfv1.variable_scope(name):
        gamma = tfv1.get_variable("gamma", [c], initializer=tfv1.ones_initializer())
        beta = tfv1.get_variable("beta", [c], initializer=tfv1.zeros_initializer())
        mean = tfv1.get_variable("moving_mean", [c], trainable=False,
                                 initializer=tfv1.zeros_initializer())
        var = tfv1.get_variable("moving_variance", [c], trainable=False,
                                initializer=tfv1.ones_initializer())
    if not training:
        return tfv1.nn.fused_batch_norm(x, gamma, beta, mean, var, epsilon,
                                        data_format=fmt, is_training=False)[0]
    y, batch_mean, batch_var = tfv1.nn.fused_batch_norm(x, gamma, beta, epsilon=epsilon,
                                                        data_format=fmt, is_training=True)
    if not update_stats:
        return y
    updates = [tfv1.assign(mean, mean * momentum + batch_mean * (1 - momentum)),
               tfv1.assign(var, var * momentum + batch_var * (1 - momentum))]
    with tf.control_dependencies(updates):
        return tf.identity(y)


def flatten_nhwc(x: tf.Tensor, nhwc: bool) -> tf.Tensor:
    """x (batch, ...) as (batch, features) in NHWC flatten order (an NCHW x transposed first),
    the row order of a Keras Flatten -> Dense kernel."""
    if not nhwc:
        x = tf.transpose(x, [0, 2, 3, 1])
    return tf.reshape(x, [-1, int(x.shape[1]) * int(x.shape[2]) * int(x.shape[3])])


def dense(x: tf.Tensor, units: int, name: str) -> tf.Tensor:
    """x @ kernel + bias with Keras' variables and initialisers (name/kernel glorot uniform,
    name/bias zeros)."""
    with tfv1.variable_scope(name):
        w = tfv1.get_variable("kernel", [int(x.shape[1]), units],
                              initializer=tfv1.glorot_uniform_initializer())
        b = tfv1.get_variable("bias", [units], initializer=tfv1.zeros_initializer())
    return tf.matmul(x, w) + b
