"""The probe's forward pass in numpy, the reference the Flax and PyTorch builder checks
(flax_cnn_builders.py, torch_cnn_builders.py) hold their canonical weights to."""

import numpy as np


def probe_reference(weights, x_nhwc):
    """The probe's softmax in numpy (float64) from its canonical weights and an NHWC batch: Keras
    layout, same-padded 3x3 conv + bias + ReLU, NHWC flatten, dense."""
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
