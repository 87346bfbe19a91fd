"""ResNet-50 v1.5 in Flax (linen), layer for layer the Keras and PyTorch builders: bottlenecks
with the stride on the 3x3 conv, no conv bias, BatchNorm (eps 1e-5, momentum 0.9 in Keras' sense)
after every conv, symmetric k // 2 padding as PyTorch pads; returns logits for NHWC input.
`dtype` is the computation dtype (None: Flax's default, from inputs and params; jnp.bfloat16:
mixed precision with float32 params and BatchNorm statistics)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import ModelSpec
from models.flax_common import check_data_format
from models.resnet50.spec import STAGES

EXPANSION = 4
# torchvision's conv initialisation (kaiming_normal_, fan_out, ReLU gain).
CONV_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class ConvBN(nn.Module):
    """Conv (no bias) -> BatchNorm -> optional ReLU."""

    features: int
    kernel: int
    stride: int = 1
    relu: bool = True
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        # Explicit k // 2 each side: "SAME" pads (0, 1) for a stride-2 3x3 conv on an even input.
        p = self.kernel // 2
        x = nn.Conv(self.features, (self.kernel, self.kernel), strides=(self.stride, self.stride),
                    padding=((p, p), (p, p)), use_bias=False, kernel_init=CONV_INIT,
                    dtype=self.dtype, name="conv")(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                         dtype=self.dtype, name="bn")(x)
        return nn.relu(x) if self.relu else x


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 x4, plus the identity or a 1x1 strided projection."""

    width: int
    stride: int
    project: bool
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        out = self.width * EXPANSION
        shortcut = x
        if self.project:
            shortcut = ConvBN(out, 1, self.stride, relu=False, dtype=self.dtype,
                              name="proj")(x, train)
        y = ConvBN(self.width, 1, dtype=self.dtype, name="a")(x, train)
        # v1.5: the stride is on the 3x3
        y = ConvBN(self.width, 3, self.stride, dtype=self.dtype, name="b")(y, train)
        y = ConvBN(out, 1, relu=False, dtype=self.dtype, name="c")(y, train)
        return nn.relu(shortcut + y)


class ResNet50(nn.Module):
    """Stem 7x7/2 + max pool 3/2, four bottleneck stages, global average pool, fc."""

    num_classes: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        x = ConvBN(64, 7, 2, dtype=self.dtype, name="stem")(x, train)
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))  # pads with -inf
        for s, (width, blocks, stride) in enumerate(STAGES, start=2):
            for b in range(blocks):
                x = Bottleneck(width, stride if b == 0 else 1, b == 0, dtype=self.dtype,
                               name=f"res{s}{chr(97 + b)}")(x, train)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="fc")(x)


def build(spec: ModelSpec, data_format: str = "channels_last", dtype: Any = None) -> nn.Module:
    """ResNet-50 v1.5 for NHWC input of spec.input_shape and spec.num_classes, returning logits."""
    check_data_format(data_format)
    return ResNet50(spec.num_classes, dtype=dtype)
