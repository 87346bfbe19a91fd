"""What kind of work a TensorFlow op type does, whatever name this host's TensorFlow gave it.

TensorFlow rewrites op types by host: with oneDNN on (TF_ENABLE_ONEDNN_OPTS=1, the default on
CPUs with AVX-512 VNNI/BF16 or AMX) a forward convolution runs as `_MklNativeFusedConv2D` or
`_MklNativeConv2DWithBias`, a filter gradient as `_MklNativeConv2DBackpropFilterWithBias`;
without it Grappler's remapper gives `_FusedConv2D` and plain `Conv2DBackpropFilter`. Every
runner and test that counts ops counts kinds through `op_kind`, never raw names, so one host
and another count the same.

Framework-free (the parent and the tests import it; runner children too).
"""

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
    """Op kinds counted from {op type: count} (or op types, one per op); unclassified ops are
    left out."""
    items = op_counts.items() if isinstance(op_counts, Mapping) else ((t, 1) for t in op_counts)
    kinds: Counter[str] = Counter()
    for op_type, n in items:
        kind = op_kind(op_type)
        if kind:
            kinds[kind] += n
    return dict(sorted(kinds.items()))
