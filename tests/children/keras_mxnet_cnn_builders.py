"""The Keras 2 (keras-mxnet) CNN builders named in argv, channels_first: parameters, FLOPs,
outputs, BatchNorm settings and the probe's canonical weights. Prints one line "RESULT <json>"."""

import json
import sys

from runners.mxnet.common import import_keras_mxnet

keras = import_keras_mxnet()  # before anything else imports keras
import numpy as np  # noqa: E402

from models import get_spec, load_builder  # noqa: E402
from models.keras2_common import (  # noqa: E402
    count_flops_keras2,
    count_params_keras2,
    count_trainable_keras2,
    get_canonical_weights,
    set_canonical_weights,
)
from tests.children.mxnet_probe_data import probe_data  # noqa: E402

out = {}
for name in sys.argv[1:]:
    spec = get_spec(name)
    h, w, c = spec.input_shape
    m = load_builder(name, "keras")(spec, data_format="channels_first")
    x = np.random.default_rng(0).standard_normal((2, c, h, w)).astype(np.float32)
    out[name] = {
        "params": count_params_keras2(m), "trainable": count_trainable_keras2(m),
        "flops": count_flops_keras2(m), "output_shape": list(m.output_shape[1:]),
        "bn": sorted({(layer.epsilon, layer.momentum, layer.scale) for layer in m.layers
                      if isinstance(layer, keras.layers.BatchNormalization)}),
        "row_sums": m.predict(x).sum(axis=1).tolist(),
    }
probe = get_spec("probe")
w, x = probe_data(probe)
m = load_builder("probe", "keras")(probe, data_format="channels_first")
set_canonical_weights(m, w)
got = get_canonical_weights(m)
out["probe/canonical"] = {
    "names": {k: list(v.shape) for k, v in got.items()},
    "round_trip": all(np.array_equal(got[k], w[k]) for k in w),
    "probs": m.predict(x).tolist(),
}
print("RESULT " + json.dumps(out))
