"""The probe model in PyTorch: conv -> ReLU -> flatten -> dense, returning logits; no BatchNorm
or dropout, so one SGD step is deterministic and the same on 1 or N devices."""

from __future__ import annotations

import torch
from torch import nn

from models import ModelSpec
from models.torch_common import apply_data_format, check_data_format

FILTERS = 4


class Probe(nn.Module):
    """Conv2d 3x3 (same padding, bias) + ReLU, flatten, Linear; modules named as the canonical
    weights ("conv", "dense")."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, w, c = spec.input_shape
        self.conv = nn.Conv2d(c, FILTERS, 3, padding=1)
        self.dense = nn.Linear(FILTERS * h * w, spec.num_classes)
        # torch flattens (c, h, w); the canonical dense kernel's rows are (h, w, c).
        self.dense.canonical_input_chw = (FILTERS, h, w)
        for m in (self.conv, self.dense):  # Keras' defaults: glorot_uniform, zero bias
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(torch.flatten(torch.relu(self.conv(x)), 1))


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.Module:
    """The probe for spec.input_shape and spec.num_classes, returning logits."""
    check_data_format(data_format)
    return apply_data_format(Probe(spec), data_format)
