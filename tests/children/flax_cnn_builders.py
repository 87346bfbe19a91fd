"""The Flax CNN builders named in argv, in the jax interpreter: parameters, FLOPs (ours, XLA's cost
analysis, in-bounds taps), outputs and BatchNorm updates; then the probe's canonical weights
against a numpy forward. Prints one line "RESULT <json>"."""

import functools
import json
import sys

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import get_spec, load_builder
from models.flax_common import (
    count_flops_flax,
    count_params_flax,
    count_trainable_flax,
    get_canonical_weights,
    set_canonical_weights,
)
from tests.children.probe_reference import probe_reference


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
                                       shape_out[1:-1], strict=False):
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
        jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after), strict=False))
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
