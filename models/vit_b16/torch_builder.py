"""ViT in PyTorch (vit_b16 and vit_tiny): models/transformer_torch.py's ViT of the spec's
TransformerShape."""

from models.transformer_torch import build_vit as build

__all__ = ["build"]
