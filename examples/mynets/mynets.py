"""A user's own torch model, as configs/my-model.yaml brings it (docs/MODELS.md): a folder the
harness puts on the child's sys.path, a function returning an nn.Module that gives logits."""

from torch import nn


def make_model(width: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))


def make_wide_lm(d_model: int = 512, layers: int = 8, seq_len: int = 8, vocab: int = 2048
                 ) -> nn.Module:
    """A wide GPT with a short context, built from the harness's own GPT code at your shape:
    its model state (parameters, gradients, optimizer) outweighs a sample's activations many
    times, the shape where sharding the state (ZeRO-3, FSDP2) fits a larger batch
    (configs/capacity-cpu.yaml)."""
    from models.transformer import TransformerShape
    from models.transformer_torch import GPT

    return GPT(TransformerShape("gpt", layers=layers, d_model=d_model, heads=8,
                                mlp_dim=4 * d_model, seq_len=seq_len, vocab=vocab))
