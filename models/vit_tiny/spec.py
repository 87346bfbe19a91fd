"""ViT's code at toy size: 32x32 images in 4x4 patches, two layers, d 128 (CIFAR-10 sized, so
a prepared CIFAR-like dataset fits it), for tests and smoke sweeps."""

from models.transformer import TransformerShape, transformer_spec

SHAPE = TransformerShape("vit", layers=2, d_model=128, heads=4, mlp_dim=512, image=32, patch=4,
                         channels=3, classes=10)

SPEC = transformer_spec(  # 412,810 parameters
    "vit_tiny", SHAPE, "ViT at toy size: 2 layers, d 128, 4 heads, 32x32 in 64 patches + class "
    "token")
