"""The Flax builders agree with the framework-free specs: parameters, FLOPs (ours and XLA's cost
analysis), outputs, BatchNorm updates, and the probe's canonical weights. JAX runs only in a
child process (the jax environment)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_child

REPO = Path(__file__).resolve().parents[1]
# The image CNNs (BatchNorm, our own FLOP counter); the transformers have their own checks below.
CNN_MODELS = [n for n in available_models() if get_spec(n).workload == "cnn"]
TRANSFORMERS = ["gpt2", "gpt2_tiny", "vit_b16", "vit_tiny"]


@pytest.fixture(scope="module")
def jax_results(jax_python: str) -> dict:
    # XLA_FLAGS emptied: one CPU device is enough here
    return run_child(jax_python, "tests/children/flax_cnn_builders.py", *CNN_MODELS,
                     env={"JAX_PLATFORMS": "cpu", "KERAS_BACKEND": "jax", "XLA_FLAGS": ""})


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", CNN_MODELS)
def test_flax_builder_matches_spec(jax_results: dict, name: str) -> None:
    s, r = get_spec(name), jax_results[name]
    assert (r["params"], r["trainable"], r["flops"]) == (
        s.params, s.trainable_params, s.flops_per_sample)
    assert r["output_shape"] == [2, s.num_classes]
    assert r["finite"]
    has_bn = s.params != s.trainable_params
    assert r["collections"] == (["batch_stats", "params"] if has_bn else ["params"])


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", CNN_MODELS)
def test_xla_cost_analysis_agrees(jax_results: dict, name: str) -> None:
    # XLA's HloCostAnalysis counts a conv's multiply-adds only where the kernel overlaps real
    # input (taps on padding are free), and one flop per element of every element-wise op (bias,
    # BatchNorm, ReLU, residual add), more where fusions recompute a producer instead of storing
    # it. So XLA = in-bounds conv/dense flops + a few flops per conv/dense output element, and it
    # sits below the spec where convs pad a lot (MiniGoogLeNet's 3x3s on 15x15 and 7x7 maps).
    s, r = get_spec(name), jax_results[name]
    xla, in_bounds = r["xla_flops_per_sample"], r["in_bounds_flops"]
    assert in_bounds <= s.flops_per_sample
    assert in_bounds < xla <= in_bounds + 12 * r["conv_dense_outputs"], (
        xla, in_bounds, s.flops_per_sample)


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_xla_cost_analysis_probe_exactly(jax_results: dict) -> None:
    # conv: 2 x 3 x 4 x 22 x 22 in-bounds taps (8 x 3 - 2 per axis) = 11,616; dense 5,120;
    # element-wise: conv bias 256 + ReLU 256 + dense bias 10 = 522.
    assert jax_results["probe"]["in_bounds_flops"] == 11_616 + 5_120
    assert jax_results["probe"]["xla_flops_per_sample"] == 11_616 + 5_120 + 522


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_strided_convs_pad_symmetrically(jax_results: dict) -> None:
    # "SAME" pads (0, 1) for a 3x3/2 conv on an even input; PyTorch and the Keras builder pad
    # k // 2 on both sides. MiniGoogLeNet's strided convs are "VALID", as in Keras.
    assert jax_results["resnet50"]["strided_conv_paddings"] == [
        "((0, 0), (0, 0))", "((1, 1), (1, 1))", "((3, 3), (3, 3))"]
    assert jax_results["minigooglenet"]["strided_conv_paddings"] == ["VALID"]


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", CNN_MODELS)
def test_train_forward_updates_batch_stats(jax_results: dict, name: str) -> None:
    s, r = get_spec(name), jax_results[name]
    assert r["train_output_shape"] == [2, s.num_classes]
    assert r["train_finite"]
    bn_stats = s.params - s.trainable_params
    if bn_stats:
        assert r["updated_collections"] == ["batch_stats"]
        assert r["batch_stats_leaves"] > 0
        assert r["batch_stats_updated"]  # every BatchNorm layer's running mean and variance moved
    else:
        assert r["updated_collections"] == []


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", CNN_MODELS)
def test_bad_data_format_is_rejected(jax_results: dict, name: str) -> None:
    assert jax_results[name]["bad_format"].startswith("ValueError: data_format")


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_probe_canonical_weights(jax_results: dict) -> None:
    r = jax_results["probe/canonical"]
    assert r["names"] == {n: list(s) for n, s in get_spec("probe").weights}
    assert r["round_trip"]
    assert r["original_untouched"]  # set_canonical_weights returns new variables
    assert r["partial"]
    assert r["frozen_kept"]
    assert r["reference_diff"] < 1e-5  # softmax vs numpy on the canonical weights


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_probe_canonical_weights_errors(jax_results: dict) -> None:
    r = jax_results["probe/canonical"]
    assert r["bad_shape"].startswith("ValueError: dense/kernel")
    assert r["unknown_name"].startswith("KeyError:") and "nope/kernel" in r["unknown_name"]
    assert jax_results["probe"]["canonical"] == "ok"
    # Canonical weights cover Conv and Dense only: a model with BatchNorm is refused.
    assert jax_results["resnet50"]["canonical"].startswith("ValueError: canonical")


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_parent_never_imports_jax(jax_results: dict) -> None:
    assert jax_results["versions"]["jax"] == "0.10.2"
    assert jax_results["versions"]["devices"] == ["cpu"]
    assert "jax" not in sys.modules and "flax" not in sys.modules


@pytest.fixture(scope="module")
def transformer_results(jax_python: str) -> dict:
    return run_child(jax_python, "tests/children/flax_transformers.py", *TRANSFORMERS,
                     env={"JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_flax_transformer_matches_spec(transformer_results: dict, name: str) -> None:
    s, r = get_spec(name), transformer_results[name]
    assert (r["params"], r["trainable"]) == (s.params, s.trainable_params)
    assert r["collections"] == ["params"]  # no BatchNorm, no dropout
    gpt = s.transformer.kind == "gpt"
    assert r["ln_epsilons"] == [1e-5 if gpt else 1e-6]
    # GELU: tanh approximation for GPT, exact (erf) for ViT
    assert (r["tanh"], r["erf"]) == ((True, False) if gpt else (False, True))
    d = r["describe"]
    assert (d["params"], d["trainable_params"]) == (s.params, s.params)
    assert d["output_shape"] == ([2, *s.input_shape, s.num_classes] if gpt
                                 else [2, s.num_classes])
    assert d["flops_source"] == "XLA cost analysis of the jitted forward (batch 1)"
    # XLA counts the matmuls as the standard count does, plus the element-wise ops, the
    # attention softmax and (causal GPT) the masked half of QK^T too: a few percent over
    assert s.flops_per_sample < d["flops_per_sample"] < 1.1 * s.flops_per_sample


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", ["gpt2_tiny", "vit_tiny"])
def test_flax_tiny_transformers_run(transformer_results: dict, name: str) -> None:
    s, r = get_spec(name), transformer_results[name]
    want = [2, *s.input_shape, s.num_classes] if s.input_kind == "tokens" else [2, s.num_classes]
    assert r["output_shape"] == r["train_output_shape"] == want
    assert r["finite"] and r["train_same"] and r["updates"] == []
    assert r["weight_std"] == pytest.approx(0.02, rel=0.05) and r["biases_zero"]
    assert r["bf16_output"] == "bfloat16" and r["bf16_params"] == ["float32"]
    # attention xla gives the default's logits (jax 0.10.2's None is XLA's own ops)
    assert r["xla_attention_max_diff"] == 0.0
    # cudnn on CPU: jax refuses it whatever the dtype, before its q/k/v dtype check (which
    # refuses float32 on a GPU): the plan's no-GPU reason
    assert r["cudnn_float32"] == r["cudnn_bfloat16"] == "RuntimeError: cuDNN is not detected."


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_flax_gpt_is_causal(transformer_results: dict) -> None:
    r = transformer_results["gpt2_tiny"]
    assert r["max_change_before"] == 0.0
    assert r["min_change_from"] > 0.0


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_flax_describe_a_users_module(transformer_results: dict) -> None:
    r = transformer_results
    # 192 -> 32 -> 10: 6,144 + 32 + 320 + 10 weights; XLA: 2 x 6,464 MACs + bias, ReLU, bias
    assert r["user"] == {"params": 6_506, "trainable_params": 6_506,
                         "flops_per_sample": 2 * 6_464 + 32 + 32 + 10,
                         "flops_source": "XLA cost analysis of the jitted forward (batch 1)",
                         "output_shape": [2, 10]}
    assert "not a flax.linen.Module" in r["not_a_model"] and "models: mine:" in r["not_a_model"]
    assert r["broken"].startswith("models: mine: the forward pass on input [1, 8, 8, 3] "
                                  "float32 failed: TypeError")
