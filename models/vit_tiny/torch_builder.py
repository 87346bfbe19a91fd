"""ViT at toy size in PyTorch: vit_b16's builder."""

from models.vit_b16.torch_builder import build

__all__ = ["build"]
