"""A user's PyTorch models file, copied as mynets.py into a folder outside the repository:
an image net with BatchNorm, a token model and a builder that returns no module."""

import torch
from torch import nn


class MyNet(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.bn = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


class MyLM(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, ids):
        return self.out(torch.tanh(self.embed(ids)))


def make_model(width):
    return MyNet(width)


def make_lm(vocab, width):
    return MyLM(vocab, width)


def make_nothing():
    return "not a model"
