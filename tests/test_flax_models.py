"""The Flax builders agree with the framework-free specs: parameters, FLOPs (ours and XLA's cost
analysis), outputs, BatchNorm updates, and the probe's canonical weights. JAX runs only in a
child process (the jax environment)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_check_script

REPO = Path(__file__).resolve().parents[1]
# The image CNNs (BatchNorm, our own FLOP counter); the transformers have their own checks below.
CNN_MODELS = [n for n in available_models() if get_spec(n).workload == "cnn"]
TRANSFORMERS = ["gpt2", "gpt2_tiny", "vit_b16", "vit_tiny"]

# Runs in the jax interpreter, from the repo root; prints one line "RESULT <json>".
JAX_CHECK = r"""
import functools, json, sys
import numpy as np
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from models import get_spec, load_builder
from models.flax_common import (count_flops_flax, count_params_flax, count_trainable_flax,
                                get_canonical_weights, set_canonical_weights)


def conv_records(model, input_shape_hwc):
    # Every Conv and Dense call of one forward pass on a batch of 1: what XLA's cost model sees.
    recs = []

    def record(next_fun, args, kwargs, ctx):
        out = next_fun(*args, **kwargs)
        m = ctx.module
        if ctx.method_name == "__call__" and isinstance(m, (nn.Conv, nn.Dense)):
            recs.append((m, tuple(args[0].shape), tuple(out.shape)))
        return out

    x = jax.ShapeDtypeStruct((1, *input_shape_hwc), jnp.float32)
    with nn.intercept_methods(record):
        jax.eval_shape(lambda x: model.init_with_output(
            {"params": jax.random.key(0), "dropout": jax.random.key(1)}, x, train=False), x)
    return recs


def strides(m):
    # nn.Conv takes None, an int or a tuple.
    s = m.strides or 1
    return (s,) * len(m.kernel_size) if isinstance(s, int) else tuple(s)


def in_bounds_flops(recs):
    # 2 x multiply-adds that touch real input, not padding: XLA's HloCostAnalysis convention.
    total = 0
    for m, shape_in, shape_out in recs:
        if isinstance(m, nn.Dense):
            total += 2 * shape_in[-1] * m.features
            continue
        pads = m.padding
        if isinstance(pads, str):
            pads = jax.lax.padtype_to_pads(shape_in[1:-1], m.kernel_size, strides(m), pads)
        taps = 1
        for n, k, s, (lo, _), o in zip(shape_in[1:-1], m.kernel_size, strides(m), pads,
                                       shape_out[1:-1]):
            taps *= sum(1 for p in range(o) for j in range(k) if 0 <= p * s - lo + j < n)
        total += 2 * taps * shape_in[-1] * m.features
    return total


out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "flax")
    model = build(spec)
    h, w, c = spec.input_shape
    x = jnp.asarray(np.random.default_rng(0).random((2, h, w, c), dtype=np.float32))
    variables = jax.jit(functools.partial(model.init, train=False))(jax.random.key(0), x)
    lowered = jax.jit(functools.partial(model.apply, train=False)).lower(variables, x)
    fwd = lowered.compile()
    y = fwd(variables, x)
    train = jax.jit(functools.partial(model.apply, train=True, mutable=["batch_stats"]))
    y_train, updates = train(variables, x, rngs={"dropout": jax.random.key(1)})
    before = variables.get("batch_stats", {})
    after = updates.get("batch_stats", {})
    same_tree = (jax.tree_util.tree_structure(before) == jax.tree_util.tree_structure(after))
    changed = same_tree and all(not np.array_equal(a, b) for a, b in zip(
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)))
    recs = conv_records(model, spec.input_shape)
    out[name] = {
        "params": count_params_flax(variables), "trainable": count_trainable_flax(variables),
        "flops": count_flops_flax(model, spec.input_shape),
        "collections": sorted(variables),
        # Per sample: the batch of 2 halved. The optimised HLO's figure is the one checked; the
        # unoptimised one is kept for the record.
        "xla_flops_per_sample": float(fwd.cost_analysis()["flops"]) / 2,
        "xla_unoptimised_flops_per_sample": float(lowered.cost_analysis()["flops"]) / 2,
        "in_bounds_flops": in_bounds_flops(recs),
        "conv_dense_outputs": sum(int(np.prod(o)) for _, _, o in recs),
        "strided_conv_paddings": sorted({str(m.padding) for m, _, _ in recs
                                         if isinstance(m, nn.Conv) and max(strides(m)) > 1}),
        "output_shape": list(y.shape), "finite": bool(jnp.isfinite(y).all()),
        "train_output_shape": list(y_train.shape),
        "train_finite": bool(jnp.isfinite(y_train).all()),
        "batch_stats_leaves": len(jax.tree_util.tree_leaves(before)),
        "batch_stats_updated": bool(changed), "updated_collections": sorted(updates),
    }
    try:
        build(spec, "channels_first")
        out[name]["bad_format"] = "no error"
    except ValueError as e:
        out[name]["bad_format"] = "ValueError: " + str(e)
    try:
        get_canonical_weights(variables)
        out[name]["canonical"] = "ok"
    except ValueError as e:
        out[name]["canonical"] = "ValueError: " + str(e)


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
model = load_builder("probe", "flax")(probe)
variables = model.init(jax.random.key(0), jnp.zeros((1, *probe.input_shape)), train=False)
rng = np.random.default_rng(1)
w = {k: rng.standard_normal(s).astype(np.float32) for k, s in probe.weights}
x = rng.standard_normal((4, *probe.input_shape)).astype(np.float32)
new = set_canonical_weights(variables, w)
got = get_canonical_weights(new)
p = np.asarray(jax.nn.softmax(model.apply(new, jnp.asarray(x), train=False), axis=-1))
result = {"names": {k: list(v.shape) for k, v in get_canonical_weights(variables).items()},
          "round_trip": all(np.array_equal(got[k], w[k]) for k in w) and set(got) == set(w),
          "original_untouched": not np.array_equal(get_canonical_weights(variables)["conv/kernel"],
                                                   w["conv/kernel"]),
          "reference_diff": float(np.abs(p - probe_reference(w, x)).max()),
          "partial": bool(np.array_equal(get_canonical_weights(set_canonical_weights(
              variables, {"dense/bias": w["dense/bias"]}))["conv/kernel"],
              get_canonical_weights(variables)["conv/kernel"]))}
frozen = set_canonical_weights(flax.core.freeze(variables), w)
result["frozen_kept"] = isinstance(frozen, flax.core.FrozenDict)
try:
    set_canonical_weights(variables, {"dense/kernel": w["dense/kernel"].T})
    result["bad_shape"] = "no error"
except ValueError as e:
    result["bad_shape"] = "ValueError: " + str(e)
try:
    set_canonical_weights(variables, {"nope/kernel": w["conv/kernel"]})
    result["unknown_name"] = "no error"
except KeyError as e:
    result["unknown_name"] = "KeyError: " + str(e)
out["probe/canonical"] = result
out["versions"] = {"jax": jax.__version__, "flax": flax.__version__,
                   "devices": [d.platform for d in jax.devices()]}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def jax_results(jax_python: str) -> dict:
    # XLA_FLAGS emptied: one CPU device is enough here
    return run_check_script(jax_python, JAX_CHECK, *CNN_MODELS,
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


# The transformers (models/transformer_flax.py), in the jax interpreter on one CPU device:
# gpt2 and vit_b16 only as shapes (jax.eval_shape: nothing allocated), the tiny ones run; then
# models.flax_common.describe on each and on a user's module without `train`, and its errors.
TRANSFORMER_CHECK = r"""
import json, re, sys
import numpy as np
import flax.linen as nn
import jax
import jax.numpy as jnp
from models import ModelSpec, get_spec, load_builder
from models.custom import CustomModelError
from models.flax_common import count_params_flax, count_trainable_flax, describe, input_struct

out = {}
for name in sys.argv[1:]:
    spec = get_spec(name)
    model = load_builder(name, "flax")(spec)
    x1 = input_struct(spec, 1)
    shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x1)
    r = {"params": count_params_flax(shapes), "trainable": count_trainable_flax(shapes),
         "collections": sorted(shapes), "describe": describe(model, spec)}
    epsilons, gelus = set(), []

    def record(next_fun, args, kwargs, ctx):
        if isinstance(ctx.module, nn.LayerNorm) and ctx.method_name == "__call__":
            epsilons.add(ctx.module.epsilon)
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jaxpr = str(jax.make_jaxpr(lambda v, x: model.apply(v, x))(shapes, x1))
    r["ln_epsilons"] = sorted(epsilons)
    prims = set(re.findall(r"= (\w+) ", jaxpr))  # exact GELU: erf or erfc; tanh: approximate
    r["erf"], r["tanh"] = bool(prims & {"erf", "erfc"}), "tanh" in prims
    if name.endswith("_tiny"):
        rng = np.random.default_rng(0)
        if spec.input_kind == "tokens":
            x = jnp.asarray(rng.integers(0, spec.num_classes, (2, *spec.input_shape)), jnp.int32)
        else:
            x = jnp.asarray(rng.standard_normal((2, *spec.input_shape)), jnp.float32)
        variables = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(x)
        apply = jax.jit(model.apply, static_argnames=("train", "mutable"))
        y = apply(variables, x, train=False)
        y_train, updates = apply(variables, x, train=True, mutable=("batch_stats",))
        r.update(output_shape=list(y.shape), finite=bool(jnp.isfinite(y).all()),
                 train_output_shape=list(y_train.shape), updates=sorted(updates),
                 train_same=bool(jnp.allclose(y, y_train)))
        params = variables["params"]
        kernels = [np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)
                   if "kernel" in jax.tree_util.keystr(k) or "embedding" in jax.tree_util.keystr(k)]
        biases = [np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(params)
                  if "bias" in jax.tree_util.keystr(k) and "ln" not in jax.tree_util.keystr(k)]
        r["weight_std"] = float(np.concatenate([k.ravel() for k in kernels]).std())
        r["biases_zero"] = all(not b.any() for b in biases)
        bf16 = load_builder(name, "flax")(spec, dtype=jnp.bfloat16)
        vb = jax.eval_shape(lambda x: bf16.init(jax.random.key(0), x), x)
        r["bf16_output"] = str(jax.eval_shape(bf16.apply, vb, x).dtype)
        r["bf16_params"] = sorted({str(v.dtype) for v in jax.tree_util.tree_leaves(vb)})
        if spec.input_kind == "tokens":
            # change the token at position 10: the logits before it must not move
            x2 = x.at[:, 10].set((x[:, 10] + 1) % spec.num_classes)
            y2 = apply(variables, x2, train=False)
            diff = np.abs(np.asarray(y2 - y)).max(axis=(0, 2))
            r["max_change_before"] = float(diff[:10].max())
            r["min_change_from"] = float(diff[10:].min())
    out[name] = r


class Mine(nn.Module):  # a user's module: no `train` argument
    @nn.compact
    def __call__(self, x):
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(10)(nn.relu(nn.Dense(32)(x)))


user = ModelSpec(name="mine", input_shape=(8, 8, 3), num_classes=10, params=0,
                 trainable_params=0, flops_per_sample=0, description="", workload="custom")
out["user"] = describe(Mine(), user)
try:
    describe(lambda x: x, user)
    out["not_a_model"] = "no error"
except CustomModelError as e:
    out["not_a_model"] = str(e)


class Broken(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(x) @ jnp.ones((3, 3))


try:
    describe(Broken(), user)
    out["broken"] = "no error"
except CustomModelError as e:
    out["broken"] = str(e)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def transformer_results(jax_python: str) -> dict:
    return run_check_script(jax_python, TRANSFORMER_CHECK, *TRANSFORMERS,
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
