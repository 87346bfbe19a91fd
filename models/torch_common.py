"""PyTorch helpers for the torch builders, the child runners and the parity test.

Imports torch: never import this module from the parent process.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from models import ModelSpec
from models.custom import CustomModelError, not_a_model_of

DATA_FORMATS = ("channels_first", "channels_last")


def check_data_format(data_format: str) -> None:
    """Raise ValueError unless data_format is channels_first or channels_last."""
    if data_format not in DATA_FORMATS:
        raise ValueError(f"data_format must be channels_first or channels_last: {data_format!r}")


def apply_data_format(model: nn.Module, data_format: str) -> nn.Module:
    """The model in the memory format of data_format (it takes NCHW-shaped tensors either way)."""
    check_data_format(data_format)
    if data_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DistributedDataParallel or DataParallel wrapper."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


def count_params_torch(model: nn.Module) -> int:
    """Parameters plus BatchNorm running mean and variance (as Keras counts its weights)."""
    model = unwrap(model)
    total = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        # num_batches_tracked is left out: Keras has no such variable.
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            total += m.running_mean.numel() + m.running_var.numel()
    return int(total)


def count_trainable_torch(model: nn.Module) -> int:
    """Parameters that require grad."""
    return int(sum(p.numel() for p in unwrap(model).parameters() if p.requires_grad))


def count_flops_torch(model: nn.Module, input_shape_chw: tuple[int, int, int]) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv2d and Linear layers (bias ignored)."""
    model = unwrap(model)
    flops = 0

    def conv_hook(m: nn.Conv2d, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal flops
        kh, kw = m.kernel_size
        macs_per_position = kh * kw * (m.in_channels // m.groups) * m.out_channels
        flops += 2 * macs_per_position * out.shape[2] * out.shape[3]

    def linear_hook(m: nn.Linear, _inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        nonlocal flops
        rows = out.numel() // m.out_features  # batch of 1, but a Linear may see extra dims
        flops += 2 * m.in_features * m.out_features * rows

    handles = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            handles.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            handles.append(m.register_forward_hook(linear_hook))
    was_training = model.training
    param = next(model.parameters())
    try:
        model.eval()  # leaves BatchNorm statistics untouched
        with torch.no_grad():
            model(torch.zeros(1, *input_shape_chw, dtype=param.dtype, device=param.device))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return int(flops)


FLOP_COUNTER = "torch.utils.flop_counter.FlopCounterMode (forward, batch 1)"


def sample_input(model_spec: ModelSpec, batch: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A batch of the spec's inputs: random int64 token ids (batch, seq_len) in [0, vocab), or
    a random float NCHW image batch from the (H, W, C) input_shape."""
    gen = torch.Generator().manual_seed(0)
    if model_spec.input_kind == "tokens":
        ids = torch.randint(0, model_spec.num_classes, (batch, model_spec.input_shape[0]),
                            generator=gen)
        return ids.to(device)
    h, w, c = model_spec.input_shape
    return torch.randn((batch, c, h, w), generator=gen).to(device=device, dtype=dtype)


def cpu_attention_flops() -> dict[Any, Any]:
    """FlopCounterMode's formula for scaled_dot_product_attention (4 x batch x heads x q x k x
    head_dim, causal or not) for the CPU kernel too, which its registry leaves out (it counts
    the CUDA flash, efficient and cuDNN kernels): the same count on every device."""
    from torch.utils.flop_counter import sdpa_flop_count

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is None:
        return {}

    def flops(query_shape: Any, key_shape: Any, value_shape: Any, *_: Any, **__: Any) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    return {op: flops}


def describe(model: Any, model_spec: ModelSpec) -> dict[str, Any]:
    """What torch says of a model (a built-in's or a user's): parameters (BatchNorm running
    statistics included, as count_params_torch counts them), trainable ones, forward FLOPs of
    one sample counted by torch's FlopCounterMode over a batch of 1 of the spec's inputs, and
    the output's shape for a batch of 2. CustomModelError when `model` is not an nn.Module or
    its forward pass fails (the model is left in the mode it was in, in eval for the passes)."""
    from torch.utils.flop_counter import FlopCounterMode

    if not isinstance(model, nn.Module):
        raise not_a_model_of(model_spec, model, "a torch.nn.Module")
    model = unwrap(model)
    param = next(iter(model.parameters()), None)
    device = param.device if param is not None else torch.device("cpu")
    dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
    was_training = model.training
    model.eval()  # leaves BatchNorm statistics untouched, dropout off
    try:
        with torch.no_grad():
            with FlopCounterMode(display=False, custom_mapping=cpu_attention_flops()) as counter:
                model(sample_input(model_spec, 1, device, dtype))
            out = model(sample_input(model_spec, 2, device, dtype))
    except Exception as exc:  # a user's forward pass: say which and why, in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CustomModelError(f"models: {model_spec.name}: the forward pass of a batch of "
                               f"{'token ids' if model_spec.input_kind == 'tokens' else 'images'}"
                               f" failed: {type(exc).__name__}: {first}") from exc
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise CustomModelError(f"models: {model_spec.name}: the model returned "
                               f"{type(out).__module__}.{type(out).__qualname__}, not a "
                               "tensor of logits")
    return {"params": count_params_torch(model), "trainable_params": count_trainable_torch(model),
            "flops_per_sample": int(counter.get_total_flops()), "flops_source": FLOP_COUNTER,
            "output_shape": list(out.shape)}


def _canonical_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every Conv2d and Linear; ValueError if other modules hold weights."""
    found = []
    for name, m in model.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            found.append((name, m))
        elif any(True for _ in m.parameters(recurse=False)) or any(
                True for _ in m.buffers(recurse=False)):
            raise ValueError(f"canonical weights cover Conv2d and Linear only; {name!r} is a "
                             f"{type(m).__name__}")
    return found


def _linear_chw(m: nn.Linear) -> tuple[int, int, int] | None:
    """(C, H, W) of the feature map a Linear reads flattened, if its builder recorded one."""
    return getattr(m, "canonical_input_chw", None)


def get_canonical_weights(model: nn.Module) -> dict[str, np.ndarray]:
    """Weights as {"<module>/<kernel|bias>": array} in Keras layout (HWIO, NHWC-flatten rows).

    A Linear fed by a flattened feature map must carry `canonical_input_chw = (C, H, W)`:
    torch flattens NCHW in (c, h, w) order, Keras in (h, w, c) order."""
    out: dict[str, np.ndarray] = {}
    for name, m in _canonical_modules(unwrap(model)):
        w = m.weight.detach().cpu().numpy()
        if isinstance(m, nn.Conv2d):
            kernel = w.transpose(2, 3, 1, 0)  # OIHW -> HWIO
        elif (chw := _linear_chw(m)) is not None:
            c, h, wd = chw
            kernel = w.reshape(m.out_features, c, h, wd).transpose(2, 3, 1, 0).reshape(
                h * wd * c, m.out_features)
        else:
            kernel = w.T
        out[f"{name}/kernel"] = np.ascontiguousarray(kernel)
        if m.bias is not None:
            out[f"{name}/bias"] = m.bias.detach().cpu().numpy().copy()
    return out


def set_canonical_weights(model: nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Assign weights named as get_canonical_weights names them; each must match one tensor."""
    unused = set(weights)
    with torch.no_grad():
        for name, m in _canonical_modules(unwrap(model)):
            targets = {f"{name}/kernel": m.weight}
            if m.bias is not None:
                targets[f"{name}/bias"] = m.bias
            for key, tensor in targets.items():
                if key not in weights:
                    continue
                value = np.asarray(weights[key])
                if key.endswith("/kernel"):
                    value = _to_torch_kernel(m, key, value)
                if tuple(value.shape) != tuple(tensor.shape):
                    raise ValueError(f"{key}: shape {value.shape} does not fit the model's "
                                     f"{tuple(tensor.shape)}")
                # copy_ keeps the parameter's own memory format (channels_last stays so).
                tensor.copy_(torch.from_numpy(np.ascontiguousarray(value)).to(tensor.dtype))
                unused.discard(key)
    if unused:
        raise KeyError(f"weights not in the model: {sorted(unused)}")


def _to_torch_kernel(m: nn.Module, key: str, kernel: np.ndarray) -> np.ndarray:
    """A canonical (Keras layout) kernel in the module's own layout."""
    if isinstance(m, nn.Conv2d):
        if kernel.ndim != 4:
            raise ValueError(f"{key}: expected an HWIO kernel, got shape {kernel.shape}")
        return kernel.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    if kernel.ndim != 2:
        raise ValueError(f"{key}: expected an (in, out) kernel, got shape {kernel.shape}")
    chw = _linear_chw(m)
    if chw is None:
        return kernel.T
    c, h, w = chw
    if kernel.shape[0] != c * h * w:
        raise ValueError(f"{key}: {kernel.shape[0]} rows, expected {h}x{w}x{c}")
    return kernel.reshape(h, w, c, -1).transpose(3, 2, 0, 1).reshape(-1, c * h * w)
