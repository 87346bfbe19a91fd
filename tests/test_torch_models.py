"""The PyTorch builders agree with the framework-free specs: parameters, FLOPs, outputs, and the
probe's canonical weights; the transformers' counts, shapes and causality, and
models.torch_common.describe. Torch runs only in a child process (the torch environment)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_check_script

REPO = Path(__file__).resolve().parents[1]
CNNS = [m for m in available_models() if get_spec(m).workload == "cnn"]
TRANSFORMERS = [m for m in available_models() if get_spec(m).workload == "transformer"]

# Runs in the torch interpreter, from the repo root; prints one line "RESULT <json>".
TORCH_CHECK = r"""
import json, sys
import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode
from models import get_spec, load_builder
from models.torch_common import (count_flops_torch, count_params_torch, count_trainable_torch,
                                 get_canonical_weights, set_canonical_weights)
torch.manual_seed(0)
out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "torch")
    h, w, c = spec.input_shape
    x = torch.from_numpy(np.random.default_rng(0).random((2, c, h, w), dtype=np.float32))
    first = build(spec, "channels_first")
    last = build(spec, "channels_last")
    last.load_state_dict(first.state_dict())  # copy_ keeps each parameter's memory format
    logits = {}
    for fmt, m in (("channels_first", first), ("channels_last", last)):
        m.eval()  # dropout off, so both formats compute the same function
        with torch.no_grad():
            xin = x.contiguous(memory_format=torch.channels_last) if fmt == "channels_last" else x
            y = m(xin)
            with FlopCounterMode(display=False) as counter:
                m(xin[:1])
        logits[fmt] = y.numpy().astype(np.float64)
        kernels = [p for p in m.parameters() if p.dim() == 4]
        out[f"{name}/{fmt}"] = {
            "params": count_params_torch(m), "trainable": count_trainable_torch(m),
            "flops": count_flops_torch(m, (c, h, w)),
            "flop_counter": int(counter.get_total_flops()),
            "flop_counter_ops": {str(k): int(v)
                                 for k, v in counter.get_flop_counts()["Global"].items()},
            "output_shape": list(y.shape), "finite": bool(torch.isfinite(y).all()),
            "kernels_channels_last": all(
                k.is_contiguous(memory_format=torch.channels_last) for k in kernels),
        }
    a, b = logits["channels_first"], logits["channels_last"]
    # Different conv kernels sum in different orders: float32 rounding grows with the logits'
    # magnitude (ResNet-50's reach ~50 with fresh BatchNorm statistics), so atol scales with it.
    scale = float(np.abs(a).max())
    out[f"{name}/formats"] = {"max_abs_diff": float(np.abs(a - b).max()), "scale": scale,
                              "allclose": bool(np.allclose(a, b, rtol=1e-5,
                                                           atol=1e-5 * max(scale, 1.0)))}
    try:
        build(spec, "nhwc")
        out[f"{name}/bad_format"] = "no error"
    except ValueError as e:
        out[f"{name}/bad_format"] = "ValueError: " + str(e)


def probe_reference(weights, x_nhwc):
    # numpy forward in Keras layout: same-padded 3x3 conv + bias + ReLU, NHWC flatten, dense.
    k, bias = weights["conv/kernel"].astype(np.float64), weights["conv/bias"].astype(np.float64)
    n, h, w, _ = x_nhwc.shape
    xp = np.pad(x_nhwc.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = np.zeros((n, h, w, k.shape[3]))
    for i in range(3):
        for j in range(3):
            y += np.einsum("nhwc,co->nhwo", xp[:, i:i + h, j:j + w, :], k[i, j])
    y = np.maximum(y + bias, 0.0).reshape(n, -1)
    z = y @ weights["dense/kernel"].astype(np.float64) + weights["dense/bias"]
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


probe = get_spec("probe")
build = load_builder("probe", "torch")
rng = np.random.default_rng(1)
w = {k: rng.standard_normal(s).astype(np.float32) for k, s in probe.weights}
x_nhwc = rng.standard_normal((4, *probe.input_shape)).astype(np.float32)
x_nchw = torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)))
ref = probe_reference(w, x_nhwc)
result = {}
for fmt in ("channels_first", "channels_last"):
    m = build(probe, fmt)
    set_canonical_weights(m, w)
    got = get_canonical_weights(m)
    with torch.no_grad():
        p = torch.softmax(m(x_nchw), dim=1).numpy()
    result[fmt] = {"names": {k: list(v.shape) for k, v in got.items()},
                   "round_trip": all(np.array_equal(got[k], w[k]) for k in w),
                   "reference_diff": float(np.abs(p - ref).max())}
try:
    set_canonical_weights(build(probe), {"dense/kernel": w["dense/kernel"].T})
    result["bad_shape"] = "no error"
except ValueError as e:
    result["bad_shape"] = "ValueError: " + str(e)
try:
    set_canonical_weights(build(probe), {"nope/kernel": w["conv/kernel"]})
    result["unknown_name"] = "no error"
except KeyError as e:
    result["unknown_name"] = "KeyError: " + str(e)
out["probe/canonical"] = result
out["versions"] = {"torch": torch.__version__}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_results(torch_python: str) -> dict:
    return run_check_script(torch_python, TORCH_CHECK, *CNNS,
                            env={"CUDA_VISIBLE_DEVICES": "", "KERAS_BACKEND": "torch"})


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", CNNS)
@pytest.mark.parametrize("fmt", ["channels_first", "channels_last"])
def test_torch_builder_matches_spec(torch_results: dict, name: str, fmt: str) -> None:
    s, r = get_spec(name), torch_results[f"{name}/{fmt}"]
    assert (r["params"], r["trainable"], r["flops"]) == (
        s.params, s.trainable_params, s.flops_per_sample)
    assert r["output_shape"] == [2, s.num_classes]
    assert r["finite"]
    assert r["kernels_channels_last"] == (fmt == "channels_last")


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", CNNS)
@pytest.mark.parametrize("fmt", ["channels_first", "channels_last"])
def test_flop_counter_mode_agrees(torch_results: dict, name: str, fmt: str) -> None:
    # FlopCounterMode counts 2 x MACs of aten.convolution and aten.addmm (the Linear; its bias
    # add is not counted), and nothing for pooling, BatchNorm or ReLU: the spec's definition.
    r = torch_results[f"{name}/{fmt}"]
    assert r["flop_counter"] == get_spec(name).flops_per_sample
    assert set(r["flop_counter_ops"]) == {"aten.convolution", "aten.addmm"}


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", CNNS)
def test_memory_formats_agree(torch_results: dict, name: str) -> None:
    r = torch_results[f"{name}/formats"]
    assert r["allclose"], r


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", CNNS)
def test_bad_data_format_is_rejected(torch_results: dict, name: str) -> None:
    assert torch_results[f"{name}/bad_format"].startswith("ValueError: data_format")


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("fmt", ["channels_first", "channels_last"])
def test_probe_canonical_weights(torch_results: dict, fmt: str) -> None:
    r = torch_results["probe/canonical"][fmt]
    assert r["names"] == {n: list(s) for n, s in get_spec("probe").weights}
    assert r["round_trip"]
    assert r["reference_diff"] < 1e-5  # softmax of NCHW input vs numpy on the NHWC input


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_probe_canonical_weights_errors(torch_results: dict) -> None:
    r = torch_results["probe/canonical"]
    assert r["bad_shape"].startswith("ValueError: dense/kernel")
    assert r["unknown_name"].startswith("KeyError:") and "nope/kernel" in r["unknown_name"]



@pytest.mark.slow
@pytest.mark.framework("torch")
def test_parent_never_imports_torch(torch_results: dict) -> None:
    assert torch_results["versions"]["torch"].startswith("2.13.0")
    assert "torch" not in sys.modules


# The transformers (and describe), in the torch interpreter; one line "RESULT <json>".
TRANSFORMER_CHECK = r"""
import json, sys
import torch
from models import get_spec, load_builder
from models.custom import CustomModelError
from models.torch_common import describe, sample_input
torch.manual_seed(0)
out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "torch")
    m = build(spec, data_format="channels_first")
    row = {"params": sum(p.numel() for p in m.parameters()),
           "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad)}
    if name.endswith("_tiny"):
        row.update(describe(m, spec))
        m.eval()
        with torch.no_grad():
            x = sample_input(spec, 2)
            y = m(x)
            row["finite"] = bool(torch.isfinite(y).all())
            if spec.input_kind == "tokens":
                row["input_dtype"] = str(x.dtype)
                changed = x.clone()
                t = spec.input_shape[0] // 2
                changed[:, t] = (changed[:, t] + 1) % spec.num_classes
                z = m(changed)
                row["before_t_unchanged"] = bool(torch.equal(y[:, :t], z[:, :t]))
                row["from_t_changed"] = bool((y[:, t:] - z[:, t:]).abs().amax() > 0)
                row["head_tied"] = not any(p.shape == (spec.num_classes, spec.transformer.d_model)
                                           for n, p in m.named_parameters() if n != "wte.weight")
            else:
                last = build(spec, data_format="channels_last")
                last.load_state_dict(m.state_dict())
                last.eval()
                row["patch_kernel_channels_last"] = last.patch_embed.weight.is_contiguous(
                    memory_format=torch.channels_last)
                z = last(x.contiguous(memory_format=torch.channels_last))
                row["formats_max_abs_diff"] = float((y - z).abs().max())
    out[name] = row
try:
    describe(object(), get_spec("gpt2_tiny"))
    out["not_a_model"] = "no error"
except CustomModelError as e:
    out["not_a_model"] = str(e)
mini = get_spec("minigooglenet")
out["minigooglenet"] = describe(load_builder("minigooglenet", "torch")(mini), mini)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def transformer_results(torch_python: str) -> dict:
    return run_check_script(torch_python, TRANSFORMER_CHECK, *TRANSFORMERS,
                            env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_torch_transformer_params_match_spec(transformer_results: dict, name: str) -> None:
    s, r = get_spec(name), transformer_results[name]
    assert (r["params"], r["trainable"]) == (s.params, s.trainable_params)


@pytest.mark.slow
@pytest.mark.framework("torch")
@pytest.mark.parametrize("name", ["gpt2_tiny", "vit_tiny"])
def test_tiny_transformers_describe(transformer_results: dict, name: str) -> None:
    """describe: torch's counts agree with the spec (FlopCounterMode with the CPU attention
    kernel counted gives the standard count exactly), and the logits' shape for a batch of 2."""
    s, r = get_spec(name), transformer_results[name]
    assert (r["params"], r["trainable_params"]) == (s.params, s.trainable_params)
    assert r["flops_per_sample"] == s.flops_per_sample
    assert r["flops_source"] == "torch.utils.flop_counter.FlopCounterMode (forward, batch 1)"
    want = [2, *s.input_shape, s.num_classes] if s.input_kind == "tokens" else [2, s.num_classes]
    assert r["output_shape"] == want and r["finite"]


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_gpt2_tiny_is_causal_and_tied(transformer_results: dict) -> None:
    r = transformer_results["gpt2_tiny"]
    assert r["input_dtype"] == "torch.int64"
    assert r["before_t_unchanged"] and r["from_t_changed"]
    assert r["head_tied"]


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_vit_tiny_memory_formats_agree(transformer_results: dict) -> None:
    r = transformer_results["vit_tiny"]
    assert r["patch_kernel_channels_last"]
    assert r["formats_max_abs_diff"] < 1e-5


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_describe_cnn_and_not_a_model(transformer_results: dict) -> None:
    s, r = get_spec("minigooglenet"), transformer_results["minigooglenet"]
    assert (r["params"], r["trainable_params"], r["flops_per_sample"]) == (
        s.params, s.trainable_params, s.flops_per_sample)
    assert r["output_shape"] == [2, 10]
    assert transformer_results["not_a_model"] == (
        "models: gpt2_tiny: ? returned builtins.object, not a torch.nn.Module")
