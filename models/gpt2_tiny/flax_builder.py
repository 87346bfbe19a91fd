"""GPT-2's Flax code (models/gpt2/flax_builder.py) at gpt2_tiny's shape."""

from models.gpt2.flax_builder import build

__all__ = ["build"]
