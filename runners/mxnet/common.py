"""MXNet-family child code shared by mxnet_native, keras_mxnet and the probes: contexts, timed
context steps, synthetic batches, versions, the keras-mxnet import. Imports MXNet."""

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

from contract.reasons import code  # noqa: E402
from models import ModelSpec, get_spec, load_builder  # noqa: E402
from models.gluon_common import set_canonical_weights  # noqa: E402
from runners import memory  # noqa: E402
from runners.common import Spec, TimedWindow, Unavailable, finite, timed_loop  # noqa: E402


def contexts(spec: Spec) -> tuple[list[mx.Context], list[dict[str, Any]]]:
    """This node's spec.devices_per_node contexts, mx.cpu(i) (virtual devices, each with its own
    parameter copy) or mx.gpu(i), and their device records."""
    n = spec.devices_per_node
    if spec.device == "cpu":
        ctxs, kind = [mx.cpu(i) for i in range(n)], "virtual CPU device (MXNet context)"
    elif mx.context.num_gpus() < n:
        raise Unavailable(f"needs {n} GPUs; MXNet sees {mx.context.num_gpus()}"
                          + ("" if mx.runtime.Features().is_enabled("CUDA")
                             else " (this MXNet build has no CUDA: install envs/mxnet-gpu.txt)"))
    else:
        ctxs, kind = [mx.gpu(i) for i in range(n)], "GPU"
    memory.baseline(code("memory.baseline_mxnet_contexts"))
    return ctxs, [{"name": str(c), "kind": kind} for c in ctxs]


def gluon_model(name: str, ctxs: list[mx.Context], weights: dict[str, np.ndarray] | None = None,
                inputs: Sequence[Any] = (), hybridize: bool = True) -> mx.gluon.HybridBlock:
    """The Gluon model `name` with a parameter copy on every context, hybridised (static memory
    and shapes) unless `hybridize` is False: Xavier initialised, or at the canonical `weights`,
    set once a forward pass on each of `inputs` (one slice per context) has completed Gluon's
    shape inference."""
    net = load_builder(name, "gluon")(get_spec(name))
    net.initialize(mx.init.Zero() if weights is not None else
                   mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctxs)
    if hybridize:
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
    """A step's global mean loss, reduced when float() reads it (after the clock reading)."""

    def __init__(self, losses: list[Any], global_batch: int) -> None:
        self.losses, self.global_batch = losses, global_batch

    def __float__(self) -> float:
        return mean_loss(self.losses, self.global_batch)


def timed_context_steps(spec: Spec, step: Callable[[], list[Any]], trainer: mx.gluon.Trainer,
                        global_batch: int) -> tuple[TimedWindow, int, list[Any]]:
    """timed_loop over `step` (each context's loss arrays), each step ended by mx.nd.waitall():
    (the window, the optimizer's num_update in it, the last step's loss arrays)."""
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


def synthetic_arrays(model_spec: ModelSpec, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """One random global batch (NCHW float32 images, integer labels), the same in every run."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *input_shape_nchw(model_spec)), dtype=np.float32)
    y = rng.integers(0, model_spec.num_classes, batch).astype(np.float32)
    return x, y


def import_keras_mxnet() -> Any:
    """keras-mxnet 2.2.4.3 imported with the MXNet backend (channels_first), the collections aliases
    it needs on Python >= 3.10 put back in this process only (docs/runners/keras_mxnet.md)."""
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
