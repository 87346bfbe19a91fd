"""The small CNN in PyTorch, layer for layer the Keras builder: Conv2d (bias) -> BatchNorm2d
(eps 1e-3, Keras momentum 0.9 = torch's 0.1) -> ReLU -> MaxPool2d, twice, then flatten ->
Linear; returns logits. Keras' initialisers (glorot_uniform, zero biases)."""

from __future__ import annotations

from torch import nn

from models import ModelSpec
from models.small_cnn.spec import BN_EPSILON, BN_MOMENTUM, FILTERS
from models.torch_common import apply_data_format, check_data_format


class SmallCNN(nn.Sequential):
    def __init__(self, in_channels: int, num_classes: int) -> None:
        layers: list[nn.Module] = []
        ch = in_channels
        for filters in FILTERS:
            layers += [nn.Conv2d(ch, filters, 3, padding=1),
                       nn.BatchNorm2d(filters, eps=BN_EPSILON, momentum=1 - BN_MOMENTUM),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2)]
            ch = filters
        # flatten C x 8 x 8
        layers += [nn.Flatten(1), nn.Linear(ch * 8 * 8, num_classes)]
        super().__init__(*layers)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.Module:
    """The small CNN for spec.input_shape and spec.num_classes, returning logits."""
    check_data_format(data_format)
    return apply_data_format(SmallCNN(spec.input_shape[2], spec.num_classes), data_format)
