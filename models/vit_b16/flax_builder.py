"""ViT in Flax (linen): models/transformer_flax.py's ViT of the spec's TransformerShape (NHWC
images in, class logits out). vit_tiny imports this builder."""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from models import ModelSpec
from models.transformer_flax import build_transformer


def build(spec: ModelSpec, data_format: str = "channels_last", dtype: Any = None,
          attention: str | None = None) -> nn.Module:
    """The ViT of spec.transformer; dtype the computation dtype (None or jnp.bfloat16); attention
    jax.nn.dot_product_attention's implementation (None: JAX's choice)."""
    return build_transformer(spec.transformer, data_format, dtype, attention)
