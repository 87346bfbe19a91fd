"""ViT at toy size in Keras 3: the same code as vit_b16 (models/vit_b16/keras_builder.py)."""

from models.vit_b16.keras_builder import build

__all__ = ["build"]
