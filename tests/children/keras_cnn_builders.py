"""The Keras 3 CNN builders named in argv, in the TF interpreter: parameters, FLOPs, outputs,
BatchNorm settings and the probe's canonical weights. Prints one line "RESULT <json>"."""

import json
import sys

import keras
import numpy as np

from models import get_spec, load_builder
from models.keras_common import (
    count_flops_keras,
    count_params_keras,
    count_trainable_keras,
    get_canonical_weights,
    set_canonical_weights,
)

out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "keras")
    for fmt in ("channels_last", "channels_first"):
        m = build(spec, data_format=fmt)
        r = {"params": count_params_keras(m), "trainable": count_trainable_keras(m),
             "flops": count_flops_keras(m), "output_shape": list(m.output.shape)[1:]}
        if fmt == "channels_last":  # channels_first convs need not run on CPU
            y = np.asarray(m(np.random.default_rng(0).random((2, *spec.input_shape),
                                                             dtype=np.float32)))
            r["row_sums"] = y.sum(axis=1).tolist()
        out[f"{name}/{fmt}"] = r
    keras.mixed_precision.set_global_policy("mixed_float16")
    out[f"{name}/mixed_float16"] = {"output_dtype": str(build(spec).output.dtype)}
    keras.mixed_precision.set_global_policy("float32")
# The probe's canonical weights: names and shapes as its spec lists them, a round trip, and
# the same softmax in both data formats.
probe = get_spec("probe")
build = load_builder("probe", "keras")
last, first = build(probe, "channels_last"), build(probe, "channels_first")
rng = np.random.default_rng(1)
w = {k: rng.standard_normal(s).astype(np.float32) for k, s in probe.weights}
set_canonical_weights(last, w)
set_canonical_weights(first, w)
got = get_canonical_weights(first)
x = rng.standard_normal((4, *probe.input_shape)).astype(np.float32)
out["probe/canonical"] = {
    "names": {k: list(v.shape) for k, v in got.items()},
    "round_trip": all(np.array_equal(got[k], w[k]) for k in w),
    "formats_diff": float(np.abs(np.asarray(last(x))
                                 - np.asarray(first(x.transpose(0, 3, 1, 2)))).max()),
}
print("RESULT " + json.dumps(out))
