"""MiniGoogLeNet in Flax (linen), module for module the Keras builder (PyImageSearch's original):
Conv with bias -> BatchNorm (Keras defaults: eps 1e-3, momentum 0.99) -> ReLU; returns logits for
NHWC input. In training, apply needs a "dropout" rng. `dtype` is the computation dtype (None:
Flax's default, from inputs and params; jnp.bfloat16: mixed precision with float32 params and
BatchNorm statistics)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import ModelSpec
from models.flax_common import check_data_format, flatten_dense
from models.minigooglenet.spec import LAYOUT

# Keras' defaults for Conv2D and Dense.
KERNEL_INIT = nn.initializers.glorot_uniform()


class ConvModule(nn.Module):
    """Conv (bias) -> BatchNorm -> ReLU; "SAME" or "VALID" padding as in Keras."""

    features: int
    kernel: int
    stride: int = 1
    padding: str = "SAME"
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        if self.padding == "SAME" and self.stride != 1:
            # TF-style "SAME" is asymmetric for strides > 1; the Keras model never does that.
            raise ValueError("'SAME' padding is only used with stride 1 here")
        x = nn.Conv(self.features, (self.kernel, self.kernel), strides=(self.stride, self.stride),
                    padding=self.padding, kernel_init=KERNEL_INIT, dtype=self.dtype,
                    name="conv")(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.99, epsilon=1e-3,
                         dtype=self.dtype, name="bn")(x)
        return nn.relu(x)


class Inception(nn.Module):
    """Concatenation of a 1x1 and a 3x3 conv module on the channel axis."""

    k1: int
    k3: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        a = ConvModule(self.k1, 1, dtype=self.dtype, name="1x1")(x, train)
        b = ConvModule(self.k3, 3, dtype=self.dtype, name="3x3")(x, train)
        return jnp.concatenate([a, b], axis=-1)


class Downsample(nn.Module):
    """Concatenation of a 3x3/2 valid conv module and a 3x3/2 valid max pool."""

    k: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        a = ConvModule(self.k, 3, 2, padding="VALID", dtype=self.dtype, name="3x3")(x, train)
        b = nn.max_pool(x, (3, 3), strides=(2, 2), padding="VALID")
        return jnp.concatenate([a, b], axis=-1)


class MiniGoogLeNet(nn.Module):
    """Stem conv module, the LAYOUT modules, average pool 7, dropout 0.5, flatten, fc."""

    num_classes: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = ConvModule(96, 3, dtype=self.dtype, name="stem")(x, train)
        for i, (a, b) in enumerate(LAYOUT, start=1):
            if a == "down":
                x = Downsample(b, dtype=self.dtype, name=f"down{i}")(x, train)
            else:
                x = Inception(a, b, dtype=self.dtype, name=f"incep{i}")(x, train)
        x = nn.avg_pool(x, (7, 7), strides=(7, 7))
        x = nn.Dropout(0.5, deterministic=not train, name="dropout")(x)
        return flatten_dense(x, self.num_classes, self.dtype)


def build(spec: ModelSpec, data_format: str = "channels_last", dtype: Any = None) -> nn.Module:
    """MiniGoogLeNet for NHWC input of spec.input_shape (32x32x3) and spec.num_classes."""
    check_data_format(data_format)
    return MiniGoogLeNet(spec.num_classes, dtype=dtype)
