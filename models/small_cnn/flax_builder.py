"""The small CNN in Flax (linen), layer for layer the Keras and torch builders: Conv (bias) ->
BatchNorm (momentum 0.9 in Keras' and Flax's meaning: moving = 0.9 x moving + 0.1 x batch;
epsilon 1e-3) -> ReLU -> max pool 2x2/2, twice, then flatten (NHWC order, as Keras' Flatten)
-> Dense; returns logits for NHWC input. Keras' initialisers (glorot_uniform kernels, zero
biases). `dtype` is the computation dtype (None: Flax's default; jnp.bfloat16: mixed precision
with float32 params and BatchNorm statistics), as the other flax builders take it."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from models import ModelSpec
from models.flax_common import check_data_format, flatten_dense
from models.small_cnn.spec import BN_EPSILON, BN_MOMENTUM, FILTERS

# Keras' defaults for Conv2D and Dense (Flax's bias_init is zeros already).
KERNEL_INIT = nn.initializers.glorot_uniform()


class SmallCNN(nn.Module):
    """FILTERS conv-BN-ReLU-maxpool blocks, flatten, fc."""

    num_classes: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        for i, filters in enumerate(FILTERS, start=1):
            x = nn.Conv(filters, (3, 3), padding="SAME", kernel_init=KERNEL_INIT,
                        dtype=self.dtype, name=f"conv{i}")(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=BN_MOMENTUM,
                             epsilon=BN_EPSILON, dtype=self.dtype, name=f"bn{i}")(x)
            x = nn.relu(x)
            x = nn.max_pool(x, (2, 2), strides=(2, 2))
        return flatten_dense(x, self.num_classes, self.dtype)


def build(spec: ModelSpec, data_format: str = "channels_last", dtype: Any = None) -> nn.Module:
    """The small CNN for NHWC input of spec.input_shape and spec.num_classes."""
    check_data_format(data_format)
    return SmallCNN(spec.num_classes, dtype=dtype)
