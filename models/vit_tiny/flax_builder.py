"""ViT's Flax code (models/vit_b16/flax_builder.py) at vit_tiny's shape."""

from models.vit_b16.flax_builder import build

__all__ = ["build"]
