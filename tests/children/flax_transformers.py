"""The Flax transformers named in argv on one CPU device (gpt2, vit_b16 as shapes only; the tiny
ones run, with attention xla too, and cudnn lowered only), then models.flax_common.describe on a
user's module and its errors. Prints one line "RESULT <json>"."""

import json
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import ModelSpec, get_spec, load_builder
from models.custom import CustomModelError
from models.flax_common import count_params_flax, count_trainable_flax, describe, input_struct

out = {}
for name in sys.argv[1:]:
    spec = get_spec(name)
    model = load_builder(name, "flax")(spec)
    x1 = input_struct(spec, 1)
    shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), x1)  # noqa: B023
    r = {"params": count_params_flax(shapes), "trainable": count_trainable_flax(shapes),
         "collections": sorted(shapes), "describe": describe(model, spec)}
    epsilons, gelus = set(), []

    def record(next_fun, args, kwargs, ctx):
        if isinstance(ctx.module, nn.LayerNorm) and ctx.method_name == "__call__":
            epsilons.add(ctx.module.epsilon)  # noqa: B023
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(record):
        jaxpr = str(jax.make_jaxpr(lambda v, x: model.apply(v, x))(shapes, x1))  # noqa: B023
    r["ln_epsilons"] = sorted(epsilons)
    prims = set(re.findall(r"= (\w+) ", jaxpr))  # exact GELU: erf or erfc; tanh: approximate
    r["erf"], r["tanh"] = bool(prims & {"erf", "erfc"}), "tanh" in prims
    if name.endswith("_tiny"):
        rng = np.random.default_rng(0)
        if spec.input_kind == "tokens":
            x = jnp.asarray(rng.integers(0, spec.num_classes, (2, *spec.input_shape)), jnp.int32)
        else:
            x = jnp.asarray(rng.standard_normal((2, *spec.input_shape)), jnp.float32)
        variables = jax.jit(lambda x: model.init(jax.random.key(0), x, train=False))(x)  # noqa: B023
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
        # attention xla: the forward as the default's (JAX's choice); cudnn: refused on CPU
        xla = load_builder(name, "flax")(spec, attention="xla")
        y_xla = jax.jit(lambda v, x: xla.apply(v, x, train=False))(variables, x)  # noqa: B023
        r["xla_attention_max_diff"] = float(jnp.abs(y_xla - y).max())
        for dtype in (None, jnp.bfloat16):
            cudnn = load_builder(name, "flax")(spec, dtype=dtype, attention="cudnn")
            try:
                jax.jit(lambda v, x: cudnn.apply(v, x, train=False)).lower(variables, x)  # noqa: B023
                r[f"cudnn_{jnp.dtype(dtype or 'float32').name}"] = "no error"
            except Exception as e:  # noqa: BLE001 - the framework's own refusal, recorded
                r[f"cudnn_{jnp.dtype(dtype or 'float32').name}"] = f"{type(e).__name__}: {e}"
        bf16 = load_builder(name, "flax")(spec, dtype=jnp.bfloat16)
        vb = jax.eval_shape(lambda x: bf16.init(jax.random.key(0), x), x)  # noqa: B023
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
