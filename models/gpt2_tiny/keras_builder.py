"""GPT-2 at toy size in Keras 3: the same code as gpt2 (models/gpt2/keras_builder.py)."""

from models.gpt2.keras_builder import build

__all__ = ["build"]
