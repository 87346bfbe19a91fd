"""MXNet-family child code shared by mxnet_native and keras_mxnet: contexts, versions, and the
import of keras-mxnet on a modern Python.

Imports MXNet: only runner child processes (and the MXNet parity test) import this module.
"""

from __future__ import annotations

import collections
import collections.abc
import os
from typing import Any

# MXNet's OpenMP pool is sized to the machine; quiet its start-up chatter.
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from models import ModelSpec  # noqa: E402
from runners.common import Spec, Unavailable  # noqa: E402

DTYPES = {"fp32": "float32", "fp16": "float16"}


def contexts(spec: Spec) -> tuple[list[mx.Context], list[dict[str, Any]]]:
    """The run's N MXNet contexts: mx.cpu(0..N-1) (device: cpu) or mx.gpu(0..N-1) (device: gpu).
    N is the devices of one node (spec.devices_per_node): all of the run's on one node, this
    worker's on a multi-node run.

    On a CPU, mx.cpu(i) are distinct contexts that share the host's cores and memory: MXNet
    keeps a separate copy of every parameter and gradient per context and reduces them through
    the kvstore exactly as it does between GPUs, which is what makes them virtual devices."""
    n = spec.devices_per_node
    if spec.device == "cpu":
        ctxs = [mx.cpu(i) for i in range(n)]
        return ctxs, [{"name": str(c), "kind": "virtual CPU device (MXNet context)"}
                      for c in ctxs]
    have = mx.context.num_gpus()
    if have < n:
        raise Unavailable(f"needs {n} GPUs; MXNet sees {have}"
                          + ("" if mx.runtime.Features().is_enabled("CUDA")
                             else " (this MXNet build has no CUDA: install envs/mxnet-gpu.txt)"))
    ctxs = [mx.gpu(i) for i in range(n)]
    return ctxs, [{"name": str(c), "kind": "GPU"} for c in ctxs]


def input_shape_nchw(model_spec: ModelSpec) -> tuple[int, int, int]:
    """MXNet's convolutions are channels_first: (C, H, W)."""
    h, w, c = model_spec.input_shape
    return (c, h, w)


def synthetic_arrays(model_spec: ModelSpec, batch: int, seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray]:
    """One random global batch (NCHW float32 images, integer labels), the same in every run."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, *input_shape_nchw(model_spec)), dtype=np.float32)
    y = rng.integers(0, model_spec.num_classes, batch).astype(np.float32)
    return x, y


def import_keras_mxnet() -> Any:
    """Import keras-mxnet 2.2.4.3 with the MXNet backend and return the keras module.

    keras-mxnet (last released 2019) still does `from collections import Iterable` in
    keras/callbacks.py; Python 3.10 removed those aliases of collections.abc. Rather than patch
    site-packages, put the aliases back on the collections module in this process only, before
    Keras is imported; nothing else in the child depends on their absence."""
    for name in ("Iterable", "Mapping", "MutableMapping", "Sequence", "Callable"):
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))
    os.environ["KERAS_BACKEND"] = "mxnet"
    import keras

    if keras.backend.backend() != "mxnet":
        raise Unavailable(f"keras {keras.__version__} loaded the {keras.backend.backend()} "
                          "backend, not mxnet (is keras-mxnet the installed keras?)")
    keras.backend.set_image_data_format("channels_first")
    return keras


def framework_versions() -> dict[str, str]:
    versions = {"mxnet": mx.__version__, "numpy": np.__version__}
    keras = __import__("sys").modules.get("keras")
    if keras is not None:
        versions["keras"] = keras.__version__
    return versions
