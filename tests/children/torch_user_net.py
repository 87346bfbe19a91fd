"""A user's PyTorch models file, copied as mynets.py into a folder outside the repository: a
small CNN builder and a builder that returns no module (tests/test_custom_models.py)."""

from torch import nn


def make_model(width=16, classes=10):
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, classes))


def not_a_model():
    return {"weights": [1, 2, 3]}
