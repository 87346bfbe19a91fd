"""ViT in Keras 3 (models/transformer_keras.py builds it from the spec's TransformerShape)."""

from __future__ import annotations

import keras

from models import ModelSpec
from models.transformer_keras import build_vit


def build(spec: ModelSpec, data_format: str = "channels_last") -> keras.Model:
    """ViT of spec.transformer: an image in data_format's layout in, logits (B, classes) out."""
    return build_vit(spec, data_format)
