"""ViT's code at toy size: 32x32 images in 4x4 patches, two layers, d 128 (CIFAR-10 sized, so
a prepared CIFAR-like dataset fits it), for tests and smoke sweeps."""

from models import ModelSpec
from models.transformer import STANDARD_COUNT, TransformerShape

SHAPE = TransformerShape("vit", layers=2, d_model=128, heads=4, mlp_dim=512, image=32, patch=4,
                         channels=3, classes=10)

SPEC = ModelSpec(
    name="vit_tiny",
    input_shape=(SHAPE.image, SHAPE.image, SHAPE.channels),
    num_classes=SHAPE.classes,
    params=SHAPE.params(),
    trainable_params=SHAPE.params(),
    flops_per_sample=SHAPE.forward_flops_per_sample(),
    description="ViT at toy size: 2 layers, d 128, 4 heads, 32x32 in 64 patches + class token",
    workload="transformer",
    flops_source=STANDARD_COUNT,
    transformer=SHAPE,
)
