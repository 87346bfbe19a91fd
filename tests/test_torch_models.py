"""The PyTorch builders agree with the framework-free specs: parameters, FLOPs, outputs, and the
probe's canonical weights; the transformers' counts, shapes and causality, and
models.torch_common.describe. Torch runs only in a child process (the torch environment)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_child

REPO = Path(__file__).resolve().parents[1]
CNNS = [m for m in available_models() if get_spec(m).workload == "cnn"]
TRANSFORMERS = [m for m in available_models() if get_spec(m).workload == "transformer"]


@pytest.fixture(scope="module")
def torch_results(torch_python: str) -> dict:
    return run_child(torch_python, "tests/children/torch_cnn_builders.py", *CNNS,
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


@pytest.fixture(scope="module")
def transformer_results(torch_python: str) -> dict:
    return run_child(torch_python, "tests/children/torch_transformers.py", *TRANSFORMERS,
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
