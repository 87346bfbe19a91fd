"""MiniGoogLeNet in PyTorch, module for module the Keras builder (PyImageSearch's original):
Conv2d with bias -> BatchNorm (Keras defaults: eps 1e-3, momentum 0.99, torch's 0.01) -> ReLU;
returns logits."""

from __future__ import annotations

import torch
from torch import nn

from models import ModelSpec
from models.minigooglenet.spec import LAYOUT
from models.torch_common import apply_data_format, check_data_format


class ConvModule(nn.Sequential):
    """Conv2d (bias) -> BatchNorm -> ReLU; "same" or "valid" padding as in Keras."""

    def __init__(self, in_ch: int, out_ch: int, k: int, stride: int, padding: str = "same"
                 ) -> None:
        if padding == "same" and stride != 1:
            raise ValueError("'same' padding is only used with stride 1 here")
        super().__init__(
            nn.Conv2d(in_ch, out_ch, k, stride=stride, padding=k // 2 if padding == "same" else 0),
            nn.BatchNorm2d(out_ch, eps=1e-3, momentum=0.01),
            nn.ReLU(inplace=True),
        )


class Inception(nn.Module):
    """Concatenation of a 1x1 and a 3x3 conv module."""

    def __init__(self, in_ch: int, k1: int, k3: int) -> None:
        super().__init__()
        self.branch1x1 = ConvModule(in_ch, k1, 1, 1)
        self.branch3x3 = ConvModule(in_ch, k3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1x1(x), self.branch3x3(x)], dim=1)


class Downsample(nn.Module):
    """Concatenation of a 3x3/2 valid conv module and a 3x3/2 valid max pool."""

    def __init__(self, in_ch: int, k: int) -> None:
        super().__init__()
        self.conv = ConvModule(in_ch, k, 3, 2, padding="valid")
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.conv(x), self.pool(x)], dim=1)


class MiniGoogLeNet(nn.Module):
    """Stem conv module, the LAYOUT modules, average pool 7, dropout 0.5, flatten, fc."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.stem = ConvModule(in_channels, 96, 3, 1)
        blocks: list[nn.Module] = []
        ch = 96
        for a, b in LAYOUT:
            if a == "down":
                blocks.append(Downsample(ch, b))
                ch += b  # the pool passes its input channels through
            else:
                blocks.append(Inception(ch, a, b))
                ch = a + b
        self.blocks = nn.Sequential(*blocks)
        self.avgpool = nn.AvgPool2d(7)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(ch, num_classes)
        for m in self.modules():  # Keras' defaults: glorot_uniform kernels, zero biases
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(self.dropout(x), 1))


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.Module:
    """MiniGoogLeNet for spec.input_shape (32x32x3) and spec.num_classes, returning logits."""
    check_data_format(data_format)
    return apply_data_format(MiniGoogLeNet(spec.input_shape[2], spec.num_classes), data_format)
