"""ResNet-50 v1.5 in PyTorch, module for module torchvision's resnet50 (written out here: there
is no CPU torchvision wheel): bottlenecks with the stride on the 3x3 conv, no conv bias,
BatchNorm (eps 1e-5, momentum 0.1, Keras' 0.9) after every conv; returns logits."""

from __future__ import annotations

import torch
from torch import nn

from models import ModelSpec
from models.resnet50.spec import STAGES
from models.torch_common import apply_data_format, check_data_format

EXPANSION = 4


def _bn(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 x4, plus the identity or a 1x1 strided projection."""

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * EXPANSION
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = _bn(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = _bn(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), _bn(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


class ResNet50(nn.Module):
    """Stem 7x7/2 + max pool 3/2, four bottleneck stages, global average pool, fc."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = _bn(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = 64
        for i, (width, blocks, stride) in enumerate(STAGES, start=1):
            layers = []
            for b in range(blocks):
                layers.append(Bottleneck(in_ch, width, stride if b == 0 else 1))
                in_ch = width * EXPANSION
            setattr(self, f"layer{i}", nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.Module:
    """ResNet-50 v1.5 for spec.input_shape (224x224x3) and spec.num_classes, returning logits."""
    check_data_format(data_format)
    return apply_data_format(ResNet50(spec.input_shape[2], spec.num_classes), data_format)
