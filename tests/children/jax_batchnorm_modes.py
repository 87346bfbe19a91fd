"""One BatchNorm training step (momentum 0) on 2 devices through each JAX runner's own step, in
both `batchnorm` modes, on a batch whose halves differ: jax_native's make_train_step on Flax,
keras_jax's build path trained by fit. argv: a spec (JSON). Prints one line "RESULT <json>"."""

import json
import sys

import numpy as np

from contract.spec import Spec
from runners.jax.keras_batchnorm import per_device_batchnorm
from runners.jax.keras_fit import BatchPlacement, make_clock, make_distribution

keras, distribution, _ = make_distribution(Spec.from_dict(json.loads(sys.argv[1])))
# imported once make_distribution has set Keras up, as before
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import optax  # noqa: E402

from runners.jax.flax_step import compile_step, create_state, make_shardings, make_train_step  # noqa: E402


class Net(nn.Module):
    @nn.compact
    def __call__(self, x, train=False):
        x = nn.BatchNorm(use_running_average=not train, momentum=0.0, epsilon=0.0)(x)
        return nn.Dense(10)(x)


rng = np.random.default_rng(0)
x = np.concatenate([rng.normal(0, 1, (4, 3)), rng.normal(5, 2, (4, 3))]).astype(np.float32)
y = np.arange(8, dtype=np.int32)
out = {"global_var": x.var(0).tolist(),
       "per_device_var": ((x[:4].var(0) + x[4:].var(0)) / 2).tolist()}
for mode in ("global", "per_device"):
    replicated, batch = make_shardings(jax.devices())
    model = Net()
    state = create_state(model, model.init(jax.random.key(0), x), optax.sgd(0.1), replicated)
    xs, ys = jax.device_put(x, batch), jax.device_put(y, batch)
    step, _ = compile_step(make_train_step(replicated, batch, mode), state, xs, ys)
    state, _ = step(state, xs, ys)
    out["flax_" + mode] = np.asarray(state.batch_stats["BatchNorm_0"]["var"]).tolist()
    out["rows_per_device"] = sorted(s.data.shape[0] for s in xs.addressable_shards)

    inputs = keras.Input((3,))
    layer = keras.layers.BatchNormalization(momentum=0.0, epsilon=0.0, name="bn")
    kmodel = keras.Model(inputs, layer(inputs))
    if mode == "per_device":
        kmodel = per_device_batchnorm(keras, kmodel)
    kmodel.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    probe = BatchPlacement(0)
    kmodel.fit(x, np.zeros_like(x), batch_size=8, shuffle=False, verbose=0,
               callbacks=[make_clock(0, 1, probe.install)])
    bn = kmodel.get_layer("bn")
    out["keras_" + mode] = np.asarray(bn.moving_variance.value).tolist()
    out["keras_class_" + mode] = type(bn).__name__
    out["keras_placement"] = probe.placement
print("RESULT " + json.dumps(out))
