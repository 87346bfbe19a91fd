"""Gluon helpers for the Gluon builders, the MXNet runners and the MXNet parity test.

Imports mxnet: never import this module from the parent process.
"""

from __future__ import annotations

from collections.abc import Iterator

import mxnet as mx
import numpy as np
from mxnet.gluon import Block, nn

from models import ModelSpec


def iter_blocks(block: Block) -> Iterator[Block]:
    """The block and all its descendants, depth first."""
    yield block
    for child in block._children.values():
        yield from iter_blocks(child)


def _size(param: mx.gluon.Parameter) -> int:
    """Number of elements of a parameter whose shape is known (builders pass in_channels)."""
    if param.shape is None or any(d <= 0 for d in param.shape):
        raise ValueError(f"{param.name}: shape {param.shape} is not known yet "
                         "(give the layer in_channels/in_units, or run a forward pass)")
    return int(np.prod(param.shape))


def count_params_gluon(net: Block) -> int:
    """Every parameter, trainable or not (BatchNorm running mean and variance included)."""
    return sum(_size(p) for p in net.collect_params().values())


def count_trainable_gluon(net: Block) -> int:
    """Parameters that receive a gradient (grad_req other than "null")."""
    return sum(_size(p) for p in net.collect_params().values() if p.grad_req != "null")


def count_flops_gluon(net: mx.gluon.HybridBlock, input_shape_chw: tuple[int, int, int]) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv2D and Dense layers (bias ignored).

    Shapes come from symbolic inference on a batch of 1, so the net need not be initialised."""
    internals = net(mx.sym.var("data")).get_internals()
    arg_shapes, out_shapes, _ = internals.infer_shape(data=(1, *input_shape_chw))
    args = dict(zip(internals.list_arguments(), arg_shapes, strict=True))
    outs = dict(zip(internals.list_outputs(), out_shapes, strict=True))
    flops = 0
    for block in iter_blocks(net):
        if isinstance(block, nn.Conv2D | nn.Dense):
            weight = args[block.weight.name]  # conv (O, I/groups, kh, kw); dense (units, in)
            out = outs[f"{block.prefix}fwd_output"]  # Gluon names each layer's op "fwd"
            positions = out[2] * out[3] if isinstance(block, nn.Conv2D) else np.prod(out[1:-1])
            flops += 2 * int(np.prod(weight)) * int(positions)
    return int(flops)


def _layers(net: Block) -> Iterator[tuple[str, nn.Conv2D | nn.Dense]]:
    """("<layer name>", block) for each Conv2D and Dense, named by its prefix below the net's."""
    for block in iter_blocks(net):
        if isinstance(block, nn.Conv2D | nn.Dense):
            yield block.prefix[len(net.prefix):].rstrip("_"), block


def _dense_chw(net: Block) -> tuple[int, int, int] | None:
    """(C, H, W) of the feature map a net's Dense flattens, if the net declares it."""
    return getattr(net, "flatten_chw", None)


def _to_canonical(net: Block, block: Block, var: str, value: np.ndarray) -> np.ndarray:
    """Gluon layout -> Keras layout (HWIO conv kernel; dense kernel rows in NHWC order)."""
    if var == "bias":
        return value
    if isinstance(block, nn.Conv2D):
        return value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    kernel = value.T  # (units, in) -> (in, units); Gluon flattens in (c, h, w) order
    chw = _dense_chw(net)
    if chw is not None:
        c, h, w = chw
        kernel = kernel.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    return kernel


def _from_canonical(net: Block, block: Block, var: str, value: np.ndarray) -> np.ndarray:
    """Keras layout -> Gluon layout: the inverse of _to_canonical."""
    if var == "bias":
        return value
    if isinstance(block, nn.Conv2D):
        return value.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    chw = _dense_chw(net)
    if chw is not None:
        c, h, w = chw
        value = value.reshape(h, w, c, -1).transpose(2, 0, 1, 3).reshape(c * h * w, -1)
    return value.T


def _params(block: Block) -> dict[str, mx.gluon.Parameter]:
    """{"kernel": weight, "bias": bias} of a Conv2D or Dense (bias only if it has one)."""
    return {"kernel": block.weight, **({"bias": block.bias} if block.bias is not None else {})}


def get_canonical_weights(net: Block) -> dict[str, np.ndarray]:
    """Weights as {"<layer>/<kernel|bias>": array} in Keras layout (see models/probe/spec.py).

    A net whose Dense flattens a feature map declares `flatten_chw = (C, H, W)` so the dense
    kernel's rows can be put in Keras' NHWC flatten order."""
    return {f"{name}/{var}": _to_canonical(net, block, var, p.data().asnumpy())
            for name, block in _layers(net) for var, p in _params(block).items()}


def set_canonical_weights(net: Block, weights: dict[str, np.ndarray]) -> None:
    """Assign weights named as get_canonical_weights names them, on every context."""
    unused = set(weights)
    for name, block in _layers(net):
        for var, param in _params(block).items():
            key = f"{name}/{var}"
            if key in weights:
                value = _from_canonical(net, block, var, np.asarray(weights[key]))
                if tuple(value.shape) != tuple(param.shape):
                    raise ValueError(f"{key}: shape {np.shape(weights[key])} in Gluon layout is "
                                     f"{value.shape}, model has {param.shape}")
                param.set_data(mx.nd.array(value, dtype=param.dtype))
                unused.discard(key)
    if unused:
        raise KeyError(f"weights not in the model: {sorted(unused)}")


FLOPS_SOURCE = ("2 x multiply-adds of the Conv2D and Dense layers (MXNet's symbolic shape "
                "inference, batch 1; other ops not counted)")


def describe(model: object, model_spec: ModelSpec) -> dict[str, object]:
    """What MXNet says of a Gluon model (check-model): parameters (initialised by a forward
    pass of the spec's inputs when they are not yet), trainable ones, forward FLOPs of one
    sample (its Conv2D and Dense layers: MXNet has no FLOP counter of its own) and the output's
    shape for a batch of 2. CustomModelError when it is not a HybridBlock or its forward fails."""
    from models.custom import CustomModelError, not_a_model_of

    if not isinstance(model, mx.gluon.HybridBlock):
        raise not_a_model_of(model_spec, model,
                          "a mxnet.gluon.HybridBlock")
    if model_spec.input_kind == "tokens":
        shape: tuple[int, ...] = tuple(model_spec.input_shape)
        x = mx.nd.array(np.random.default_rng(0).integers(0, model_spec.num_classes,
                                                          (2, *shape)))
    else:
        h, w, c = model_spec.input_shape
        shape = (c, h, w)
        x = mx.nd.array(np.random.default_rng(0).random((2, *shape), dtype=np.float32))
    try:
        if any(p._data is None for p in model.collect_params().values()):
            model.initialize()
        out = model(x)
        flops = count_flops_gluon(model, shape)  # type: ignore[arg-type]
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        raise CustomModelError(f"models: {model_spec.name}: a forward pass on a batch of "
                               f"{list(x.shape)} raised {type(exc).__name__}: "
                               f"{lines[0][:300] if lines else ''}") from None
    return {"params": count_params_gluon(model), "trainable_params": count_trainable_gluon(model),
            "flops_per_sample": flops, "flops_source": FLOPS_SOURCE,
            "output_shape": list(out.shape)}
