"""Native MXNet: a hybridised Gluon network, one context per device, gradients reduced through
a kvstore (the native baseline seed 000 measured Keras-MXNet against).

Split: the global batch B is split into N equal slices, one per context (mx.cpu(i) here,
mx.gpu(i) on GPUs); the synthetic slices are copied to their contexts once, before the timed
window, so a step copies nothing from the host. Real data (data: real): every step takes the
next global batch from MXNet's ImageRecordIter over train.rec (runners/mxnet/data.py; decode
and augmentation in its own threads, running ahead of training) and copies its N slices to
the contexts (split_and_load) inside the timed step. Parameters: one copy per context,
initialised identically. Forward and backward run per context under autograd.record(); each
context's per-example losses are summed, not averaged, so its gradients are the sum over its
slice.
Reduce: gluon.Trainer pushes every context's gradient to the kvstore (`device`: summed on the
devices, peer to peer between GPUs; `local`: summed on the CPU; `nccl`: NCCL all-reduce) and
pulls the sum back; trainer.step(B) scales it by 1/B, so every context applies the gradient
of the global mean loss: synchronous SGD, identical to one device with batch B.
Synchronise: mx.nd.waitall() after every step, so each clock reading follows a finished step
(MXNet's engine is asynchronous; without it the clock would time the dispatch).
Placement: the context and rows of each slice's loss array of the last timed step (and the
contexts of every parameter's copies), read from the NDArrays.
Equivalence: the same hybridize(static_alloc, static_shape), Trainer and kvstore and resident
slices, on the probe model, one plain SGD step.
Threads: on CPU the parent sets OMP_NUM_THREADS to the physical cores shared by the N contexts
(MXNet's perf guide; MXNet's own default halves the logical CPUs, see runners/threads.py).

Follows MXNet 1.9.1's Gluon data parallelism (split_and_load, Trainer over a kvstore, hybridize
with static memory). Differs from seed 000's native reference (MXNet 0.10.1, Symbol/Module
API, train_imagenet.py): Gluon's CachedOp instead of a bound Module; the kvstore reduction and
the per-context executors are the same engine's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mxnet as mx
from mxnet import autograd, gluon

from models import get_spec, load_builder
from models.gluon_common import (
    count_flops_gluon,
    count_params_gluon,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import (
    Spec,
    Unavailable,
    finite,
    main,
    timed_loop,
)
from runners.mxnet.common import (
    DTYPES,
    contexts,
    framework_versions,
    input_shape_nchw,
    synthetic_arrays,
)
from runners.mxnet.data import describe_pipeline, nd_batches, record_iter, stream
from runners.real_data import check_classes, describe, open_dataset


def make_trainer(spec: Spec, net: gluon.Block, ctxs: list[mx.Context], optimizer: str,
                 params: dict[str, Any]) -> gluon.Trainer:
    """A gluon.Trainer over the net's parameters with the kvstore the config chose."""
    kvstore = spec.options["kvstore"]
    if kvstore == "nccl" and spec.device != "gpu":
        raise Unavailable("kvstore nccl needs GPUs; use device or local on CPU contexts")
    if kvstore == "nccl" and not mx.runtime.Features().is_enabled("NCCL"):
        raise Unavailable("kvstore nccl: this MXNet build has no NCCL")
    return gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kvstore)


def split_to_contexts(array: Any, ctxs: list[mx.Context], dtype: str = "float32") -> list[Any]:
    """Equal slices of a host array along the batch axis, each copied to its context."""
    return gluon.utils.split_and_load(mx.nd.array(array, dtype=dtype), ctxs, even_split=True)


def real_feed(batches: Iterator[tuple[Any, Any]], ctxs: list[mx.Context], dtype: str,
              labels: list[int]) -> Iterator[tuple[list[Any], list[Any]]]:
    """Each global batch of the iterator split over the contexts (cast there for fp16); the
    first batch's labels are appended to `labels`, as the record's evidence of what trained."""
    for x, y in batches:
        if not labels:
            labels.extend(int(v) for v in y.asnumpy())
        xs = gluon.utils.split_and_load(x, ctxs, even_split=True)
        if dtype != "float32":
            xs = [s.astype(dtype) for s in xs]
        yield xs, gluon.utils.split_and_load(y, ctxs, even_split=True)


def synthetic_feed(xs: list[Any], ys: list[Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    """The same resident slices every step."""
    while True:
        yield xs, ys


def hybridize_as_configured(net: gluon.HybridBlock, spec: Spec) -> bool:
    """hybridize (default): compile the net to a static graph with static memory and shapes,
    as the MXNet docs advise for speed; false keeps the imperative Gluon net."""
    hybridize = bool(spec.options["hybridize"])
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    return hybridize


def read_placement(losses: list[Any], net: gluon.Block) -> dict[str, Any]:
    """Where a step ran, read from MXNet's arrays: the context of each slice's loss (computed
    by the forward on that slice) with its rows, and the parameter copies per context."""
    rows: dict[str, int] = {}
    for loss in losses:
        rows[str(loss.context)] = rows.get(str(loss.context), 0) + int(loss.shape[0])
    copies: dict[str, int] = {}
    for param in net.collect_params().values():
        for data in param.list_data():
            copies[str(data.context)] = copies.get(str(data.context), 0) + 1
    return {"placement": rows, "parameter_copies": copies,
            "placement_source": "NDArray.context and rows of each slice's loss array of the "
                                "step; parameter_copies: contexts of each Parameter's data()"}


def train_step(net: gluon.Block, trainer: gluon.Trainer, loss_fn: gluon.loss.Loss,
               xs: list[Any], ys: list[Any], global_batch: int) -> list[Any]:
    """One synchronous step over every context; returns the per-context loss arrays."""
    with autograd.record():
        losses = [loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
    autograd.backward(losses)
    trainer.step(global_batch)  # kvstore sum over contexts, then gradient x 1/global_batch
    return losses


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


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec.options
    ctxs, devices = contexts(spec)
    n, global_batch = len(ctxs), spec.global_batch_size
    spec.split_batch(n, "contexts")
    dtype = DTYPES[spec.precision]
    if dtype == "float16" and spec.device == "cpu":
        raise Unavailable("fp16 on CPU contexts: MXNet 1.9 has no float16 convolution "
                          "kernels for the CPU; run fp16 on GPUs")
    model_spec = get_spec(spec.model)
    real = spec.data == "real"
    if real:  # open the dataset first: a bad folder is unavailable before the net is built
        data = open_dataset(spec)
        check_classes(data, model_spec.num_classes, spec.model)
        size = model_spec.input_shape[0]
        it = record_iter(data, size, global_batch, spec.device)
    net = load_builder(spec.model, "gluon")(model_spec)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctxs)
    if dtype == "float16":
        net.cast("float16")  # fp32 master weights are kept by multi_precision below
    hybridize = hybridize_as_configured(net, spec)
    trainer = make_trainer(spec, net, ctxs, "sgd", {
        "learning_rate": 0.01, "momentum": 0.9, "multi_precision": dtype == "float16"})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    labels: list[int] = []
    if real:
        feed = real_feed(nd_batches(stream(it)), ctxs, dtype, labels)
    else:
        x, y = synthetic_arrays(model_spec, global_batch)
        feed = synthetic_feed(split_to_contexts(x, ctxs, dtype), split_to_contexts(y, ctxs))

    optimizer = trainer._optimizer  # its num_update counts applied steps
    start = 0  # num_update when the clock starts
    last: list[Any] = []  # the loss arrays of the last step: where it ran

    def open_window() -> None:
        nonlocal start
        start = optimizer.num_update

    def sync(losses: list[Any]) -> StepLoss:
        nonlocal last
        mx.nd.waitall()  # the update has landed on every context
        last = losses
        return StepLoss(losses, global_batch)

    window = timed_loop(lambda: train_step(net, trainer, loss_fn, *next(feed), global_batch),
                        sync, spec.warmup_steps, spec.measure_steps, on_start=open_window)
    steps = optimizer.num_update - start
    if real:
        placement = ("each global batch from the ImageRecordIter split over the contexts "
                     "(split_and_load) inside the timed step")
        extra = {**describe(data, size), "first_batch_labels": labels,
                 "input_pipeline": f"{describe_pipeline(data, size, spec.device)}; "
                                   f"{placement}"}
    else:
        placement, extra = "one synthetic slice per context, copied once before timing", {}
    return {
        **window.summary(global_batch, steps * global_batch),
        "loss_kind": "global mean cross-entropy of each step's batch",
        "replicas": n,
        "framework": framework_versions(),
        "devices": devices,
        "layout": "channels_first",
        "dtype": dtype,
        "api": "gluon",
        "hybridize": hybridize,
        "kvstore": trainer._kvstore.type if trainer._kvstore is not None else
        f"none (kvstore {opts['kvstore']!r} skipped: one context)",
        "data_placement": placement,
        **read_placement(last, net),
        "params": count_params_gluon(net),
        "flops_per_sample": count_flops_gluon(net, input_shape_nchw(model_spec)),
        **extra,
    }


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model through the benchmark's path (its hybridize,
    Trainer and kvstore, the synthetic slices resident on the contexts); weights saved."""
    ctxs, devices = contexts(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    n = len(ctxs)
    spec.split_batch(n, "contexts", rows=len(x))
    net = load_builder("probe", "gluon")(get_spec("probe"))
    net.initialize(mx.init.Zero(), ctx=ctxs)
    hybridize = hybridize_as_configured(net, spec)
    xs = split_to_contexts(x.transpose(0, 3, 1, 2), ctxs)  # inputs come NHWC
    ys = split_to_contexts(y.astype("float32"), ctxs)
    for s in xs:  # completes deferred shape inference on every context (no gradient)
        net(s)
    set_canonical_weights(net, weights)
    trainer = make_trainer(spec, net, ctxs, "sgd", {"learning_rate": lr})
    feed = synthetic_feed(xs, ys)
    losses = train_step(net, trainer, gluon.loss.SoftmaxCrossEntropyLoss(), *next(feed), len(x))
    loss = mean_loss(losses, len(x))
    mx.nd.waitall()
    spec.save_equivalence_output(get_canonical_weights(net))
    return {"replicas": n, "framework": framework_versions(), "devices": devices,
            "loss": loss, "hybridize": hybridize, **read_placement(losses, net),
            "kvstore": trainer._kvstore.type if trainer._kvstore is not None else "none"}


if __name__ == "__main__":
    main(benchmark, equivalence)
