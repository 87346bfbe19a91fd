"""What kind of work a TensorFlow op type does, whatever name this host's TensorFlow gave it
(oneDNN's `_MklNative...` and Grappler's `_Fused...` names count as the plain ones).
Framework-free (the parent and the tests import it). docs/runners/tf_family.md."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

CONV_FORWARD = "conv_forward"
CONV_BACKPROP_FILTER = "conv_backprop_filter"
CONV_BACKPROP_INPUT = "conv_backprop_input"
MATMUL = "matmul"
BATCHNORM_FORWARD = "batchnorm_forward"
BATCHNORM_GRAD = "batchnorm_grad"
ALLREDUCE = "allreduce"
KINDS = (CONV_FORWARD, CONV_BACKPROP_FILTER, CONV_BACKPROP_INPUT, MATMUL, BATCHNORM_FORWARD,
         BATCHNORM_GRAD, ALLREDUCE)

# oneDNN and Grappler prefixes and suffixes around the op's own name
_DECORATION = re.compile(r"^_(MklNative|Mkl|Fused|MklNativeFused|MklFused)+|"
                         r"(WithBias|WithBiasAndAdd|AndRequantize)+$")
_CONV = re.compile(r"^(Conv[23]D|DepthwiseConv2dNative|Conv2DWithBias)$")


def _core(op_type: str) -> str:
    """The op's own name: `_MklNativeFusedConv2D` -> `Conv2D`,
    `_MklNativeConv2DBackpropFilterWithBias` -> `Conv2DBackpropFilter`."""
    previous = None
    core = op_type
    while core != previous:
        previous, core = core, _DECORATION.sub("", core)
    return core


def op_kind(op_type: str) -> str | None:
    """The kind of work an op type does (a name in KINDS), or None for everything else."""
    core = _core(op_type)
    if "BackpropFilter" in core and ("Conv" in core or "Depthwise" in core):
        return CONV_BACKPROP_FILTER
    if "BackpropInput" in core and ("Conv" in core or "Depthwise" in core):
        return CONV_BACKPROP_INPUT
    if _CONV.match(core):
        return CONV_FORWARD
    if core in ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        return MATMUL
    if "BatchNormGrad" in core:  # FusedBatchNormGradV3, _MklNativeFusedBatchNormGradV3
        return BATCHNORM_GRAD
    if "BatchNorm" in core:
        return BATCHNORM_FORWARD
    if core in ("NcclAllReduce", "CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3",
                "CollectiveAllToAllV2", "NcclReduce"):
        return ALLREDUCE
    return None


def count_kinds(op_counts: Mapping[str, int] | Iterable[str]) -> dict[str, int]:
    """Op kinds counted from {op type: count} (or op types); unclassified ops left out."""
    items = op_counts.items() if isinstance(op_counts, Mapping) else ((t, 1) for t in op_counts)
    kinds: Counter[str] = Counter()
    for op_type, n in items:
        kind = op_kind(op_type)
        if kind:
            kinds[kind] += n
    return dict(sorted(kinds.items()))
