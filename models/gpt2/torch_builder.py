"""GPT-2 in PyTorch (gpt2 and gpt2_tiny): models/transformer_torch.py's GPT of the spec's
TransformerShape."""

from models.transformer_torch import build_gpt as build

__all__ = ["build"]
