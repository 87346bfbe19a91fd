"""A user's own torch model, as configs/my-model.yaml brings it (docs/MODELS.md): a folder the
harness puts on the child's sys.path, a function returning an nn.Module that gives logits."""

from torch import nn


def make_model(width: int = 64, classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
        nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, classes))
