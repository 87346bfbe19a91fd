"""ResNet-50 v1.5 in Gluon, layer for layer the Keras builder (torchvision's resnet50):
bottleneck blocks with the stride on the 3x3 conv, no conv bias, BatchNorm (eps 1e-5, momentum
0.9) after every conv, k // 2 padding on each side. Returns logits; the loss applies softmax."""

from __future__ import annotations

from typing import Any

from mxnet.gluon import HybridBlock, nn

from models import ModelSpec
from models.resnet50.spec import STAGES


def conv_bn(cin: int, cout: int, k: int, stride: int, prefix: str,
            relu: bool = True) -> nn.HybridSequential:
    """Conv (no bias, padding k // 2) -> BatchNorm -> optional ReLU."""
    seq = nn.HybridSequential(prefix=prefix)
    with seq.name_scope():
        seq.add(nn.Conv2D(cout, k, strides=stride, padding=k // 2, use_bias=False,
                          in_channels=cin, prefix="conv_"),
                nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=cout, prefix="bn_"))
        if relu:
            seq.add(nn.Activation("relu", prefix="relu_"))
    return seq


class Bottleneck(HybridBlock):
    """1x1 -> 3x3 (strided) -> 1x1 x4, plus the identity or a strided 1x1 projection."""

    def __init__(self, cin: int, width: int, stride: int, project: bool, prefix: str) -> None:
        super().__init__(prefix=prefix)
        with self.name_scope():
            self.proj = conv_bn(cin, width * 4, 1, stride, "proj_", relu=False) if project else None
            self.body = nn.HybridSequential(prefix="")
            self.body.add(conv_bn(cin, width, 1, 1, "a_"),
                          conv_bn(width, width, 3, stride, "b_"),  # v1.5: the stride is here
                          conv_bn(width, width * 4, 1, 1, "c_", relu=False))

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        shortcut = x if self.proj is None else self.proj(x)
        return F.relu(self.body(x) + shortcut)


def build(spec: ModelSpec, data_format: str = "channels_first") -> nn.HybridSequential:
    """ResNet-50 v1.5 for NCHW spec.input_shape (224x224x3) and spec.num_classes: logits."""
    if data_format != "channels_first":
        raise ValueError(f"Gluon convolutions are channels_first (NCHW): {data_format!r}")
    cin = spec.input_shape[2]
    net = nn.HybridSequential(prefix="resnet50_")
    with net.name_scope():
        # Zero padding (as Keras') and -inf padding agree here: the pool's input is post-ReLU.
        net.add(conv_bn(cin, 64, 7, 2, "stem_"),
                nn.MaxPool2D(3, strides=2, padding=1, prefix="stem_pool_"))
        cin = 64
        for s, (width, blocks, stride) in enumerate(STAGES, start=2):
            for b in range(blocks):
                net.add(Bottleneck(cin, width, stride if b == 0 else 1, b == 0,
                                   f"res{s}{chr(97 + b)}_"))
                cin = width * 4
        net.add(nn.GlobalAvgPool2D(prefix="avg_pool_"),
                nn.Dense(spec.num_classes, in_units=cin, prefix="fc_"))
    return net
