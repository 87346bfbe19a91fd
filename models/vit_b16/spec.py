"""ViT-B/16 (Dosovitskiy et al. 2021, 86M): the image transformer, 224x224, patch 16."""

from models.transformer import TransformerShape, transformer_spec

SHAPE = TransformerShape("vit", layers=12, d_model=768, heads=12, mlp_dim=3072, image=224,
                         patch=16, channels=3, classes=1000)

SPEC = transformer_spec(
    "vit_b16", SHAPE, "ViT-B/16: 12 layers, d 768, 12 heads, 224x224 in 196 patches + class "
    "token",
    published_params=86_567_656)  # timm's vit_base_patch16_224 (class token, 1,000 classes)
