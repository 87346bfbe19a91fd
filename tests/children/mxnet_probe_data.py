"""The probe's canonical weights and NCHW input, drawn alike by the Gluon and keras-mxnet
builder checks (gluon_cnn_builders.py, keras_mxnet_cnn_builders.py)."""

import numpy as np


def probe_data(probe):
    rng = np.random.default_rng(1)
    w = {k: rng.standard_normal(s).astype(np.float32) for k, s in probe.weights}
    return w, rng.standard_normal((4, *probe.input_shape)).astype(np.float32).transpose(0, 3, 1, 2)
