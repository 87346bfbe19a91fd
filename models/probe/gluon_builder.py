"""The probe model in Gluon: conv 3x3x4 same + bias + ReLU, flatten, dense 10 (logits; the
loss applies softmax). No BatchNorm or dropout, so one SGD step is the same on 1 or N devices."""

from __future__ import annotations

from typing import Any

from mxnet.gluon import HybridBlock, nn

from models import ModelSpec


class Probe(HybridBlock):
    """Layers "conv" and "dense" carry the canonical weight names (models.gluon_common)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(prefix="probe_")
        h, w, c = spec.input_shape
        # Gluon flattens in (c, h, w) order, Keras in (h, w, c): gluon_common maps the dense
        # kernel's rows between the two with this shape.
        self.flatten_chw = (4, h, w)
        with self.name_scope():
            self.conv = nn.Conv2D(4, 3, padding=1, in_channels=c, prefix="conv_")
            self.dense = nn.Dense(spec.num_classes, in_units=4 * h * w, prefix="dense_")

    def hybrid_forward(self, F: Any, x: Any) -> Any:
        return self.dense(F.flatten(F.relu(self.conv(x))))


def build(spec: ModelSpec, data_format: str = "channels_first") -> Probe:
    """The probe for NCHW spec.input_shape: logits."""
    if data_format != "channels_first":
        raise ValueError(f"Gluon convolutions are channels_first (NCHW): {data_format!r}")
    return Probe(spec)
