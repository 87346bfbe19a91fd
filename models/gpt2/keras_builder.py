"""GPT-2 in Keras 3 (models/transformer_keras.py builds it from the spec's TransformerShape)."""

from __future__ import annotations

from typing import Any

import keras

from models import ModelSpec
from models.transformer_keras import build_gpt


def build(spec: ModelSpec, **kwargs: Any) -> keras.Model:
    """GPT-2 of spec.transformer: token ids (B, seq_len) in, logits (B, seq_len, vocab) out.
    Keyword arguments a runner gives every builder (data_format) do not apply to tokens."""
    return build_gpt(spec)
