"""The Flax builders agree with the framework-free specs: parameters, FLOPs (ours and XLA's cost
analysis), outputs, BatchNorm updates, and the probe's canonical weights. JAX runs only in a
child process (the jax environment)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from models import available_models, get_spec
from tests.conftest import run_check_script

REPO = Path(__file__).resolve().parents[1]

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
    return run_check_script(jax_python, JAX_CHECK, *available_models(),
                            env={"JAX_PLATFORMS": "cpu", "KERAS_BACKEND": "jax", "XLA_FLAGS": ""})


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("name", available_models())
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
@pytest.mark.parametrize("name", available_models())
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
@pytest.mark.parametrize("name", available_models())
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
@pytest.mark.parametrize("name", available_models())
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
