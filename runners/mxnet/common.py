"""MXNet-family child code shared by mxnet_native and keras_mxnet: contexts, versions, and the
import of keras-mxnet on a modern Python.

Imports MXNet: only runner child processes (and the MXNet parity test) import this module.
"""

from __future__ import annotations

import collections
import collections.abc
import os
from collections.abc import Callable, Sequence
from typing import Any

# MXNet's OpenMP pool is sized to the machine; quiet its start-up chatter.
os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402

from models import ModelSpec, get_spec, load_builder  # noqa: E402
from models.gluon_common import set_canonical_weights  # noqa: E402
from runners.common import Spec, TimedWindow, Unavailable, finite, timed_loop  # noqa: E402

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


def gluon_model(name: str, ctxs: list[mx.Context], weights: dict[str, np.ndarray] | None = None,
                inputs: Sequence[Any] = ()) -> mx.gluon.HybridBlock:
    """The Gluon model `name` from models/ with a copy of its parameters on every context,
    hybridised with static memory and shapes (as MXNet's docs advise for speed): Xavier
    initialised, or at the canonical `weights`, set once a forward pass on each of `inputs`
    (one slice per context, no gradient) has completed Gluon's deferred shape inference."""
    net = load_builder(name, "gluon")(get_spec(name))
    net.initialize(mx.init.Zero() if weights is not None else
                   mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctxs)
    net.hybridize(static_alloc=True, static_shape=True)
    if weights is not None:
        for x in inputs:
            net(x)
        set_canonical_weights(net, weights)
    return net


def mean_loss(losses: list[Any], global_batch: int) -> float:
    """The global mean loss of a step (reading it waits for the forward pass)."""
    return finite(sum(float(l.sum().asscalar()) for l in losses) / global_batch)  # noqa: E741


class StepLoss:
    """A step's global mean loss, computed when float() reads it: the timed loop reads it after
    the step's clock reading, so the reduction of the loss arrays is not timed with the step."""

    def __init__(self, losses: list[Any], global_batch: int) -> None:
        self.losses, self.global_batch = losses, global_batch

    def __float__(self) -> float:
        return mean_loss(self.losses, self.global_batch)


def timed_context_steps(spec: Spec, step: Callable[[], list[Any]], trainer: mx.gluon.Trainer,
                        global_batch: int) -> tuple[TimedWindow, int, list[Any]]:
    """runners.common.timed_loop over `step` (one step over every context; it returns each
    context's loss array), each step ended by mx.nd.waitall() (MXNet's engine is asynchronous:
    the update has then landed on every context). Returns the window, the steps the trainer's
    optimizer applied in it (its num_update) and the loss arrays of the last step (where it
    ran)."""
    optimizer = trainer._optimizer  # its num_update counts applied steps
    start = 0  # num_update when the clock starts
    last: list[Any] = []

    def open_window() -> None:
        nonlocal start
        start = optimizer.num_update

    def sync(losses: list[Any]) -> StepLoss:
        nonlocal last
        mx.nd.waitall()
        last = losses
        return StepLoss(losses, global_batch)

    window = timed_loop(step, sync, spec.warmup_steps, spec.measure_steps, on_start=open_window)
    return window, optimizer.num_update - start, last


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
