"""The probe model in Flax (linen): conv -> ReLU -> flatten -> dense, returning logits; no
BatchNorm or dropout, so one SGD step is deterministic and the same on 1 or N devices. `dtype`
is the computation dtype (None: Flax's default, from inputs and params)."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from models import ModelSpec
from models.flax_common import check_data_format, flatten_dense

FILTERS = 4


class Probe(nn.Module):
    """Conv 3x3 (same padding, bias) + ReLU, flatten, Dense; submodules named as the canonical
    weights ("conv", "dense"), Keras' initialisers (glorot_uniform kernels, zero biases)."""

    num_classes: int
    dtype: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        del train  # nothing here behaves differently in training
        x = nn.Conv(FILTERS, (3, 3), padding="SAME", kernel_init=nn.initializers.glorot_uniform(),
                    dtype=self.dtype, name="conv")(x)
        # NHWC flattened in (h, w, c) order: the canonical dense kernel's row order.
        return flatten_dense(nn.relu(x), self.num_classes, self.dtype, name="dense")


def build(spec: ModelSpec, data_format: str = "channels_last", dtype: Any = None) -> nn.Module:
    """The probe for NHWC input of spec.input_shape and spec.num_classes, returning logits."""
    check_data_format(data_format)
    return Probe(spec.num_classes, dtype=dtype)
