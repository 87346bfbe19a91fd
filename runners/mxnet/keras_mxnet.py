"""Keras 2.2 on MXNet (keras-mxnet 2.2.4.3): the model compiled with a context list, as seed 000
describes (`compile(..., context=[...])`), trained by fit_generator or fit on arrays.
keras-mxnet's Module slices each batch over the contexts and sums gradients in the kvstore;
option gradient_reduce mean divides the rate by N. Differs from seed 000 (Keras 1.2 on MXNet
0.10.1): the Keras 2.2 API. docs/runners/keras_mxnet.md, "Notes from the code"."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import mxnet as mx
import numpy as np

from contract.reasons import code
from contract.result import join
from models import get_spec, load_builder
from models import keras2_common as k2
from runners.common import Invalid, Spec, TimedWindow, Unavailable, finite, main
from runners.mxnet import common as mxc
from runners.mxnet.data import describe_pipeline, numpy_batches, record_iter, stream
from runners.real_data import RealData, batch_at, describe, open_for_model

keras = mxc.import_keras_mxnet()


class StepClock(keras.callbacks.Callback):
    """The timed window of fit (`window`): started after the warm-up batches, ticked after
    each batch once MXNet's engine has finished everything queued (the update included)."""

    def __init__(self, warmup: int, measure: int) -> None:
        super().__init__()
        self.window = TimedWindow(warmup, measure)

    def on_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.window.warmup == 0 and not self.window.started:
            mx.nd.waitall()
            self.window.start()

    def on_batch_end(self, batch: int, logs: dict | None = None) -> None:
        mx.nd.waitall()
        self.window.step_done((logs or {})["loss"])


def keras_batches(batches: Iterator[tuple[np.ndarray, np.ndarray]], labels: list[int]
                  ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Host batches, labels as the (B, 1) column the loss takes; the first batch's labels are
    appended to `labels` (the record's evidence of what trained)."""
    for x, y in batches:
        if not labels:
            labels.extend(int(v) for v in y)
        yield x, y.reshape(-1, 1)


def real_feed(spec: Spec, data: RealData, size: int, global_batch: int, steps: int,
              labels: list[int]) -> tuple[tuple[Any, dict[str, Any]], str]:
    """(fit_generator's real-data source, its worker arguments), the input_pipeline line."""
    if spec.options["loader"] == "keras":
        from runners.keras_data import describe_keras, fit_worker_kwargs, jpeg_sequence

        labels.extend(data.files[i][1] for i in batch_at(len(data.files), global_batch, 0))
        kwargs = {**fit_worker_kwargs(data), "shuffle": False}  # the Sequence shuffles itself
        return ((jpeg_sequence(data, size, global_batch, steps, channels_first=True), kwargs),
                f"{describe_keras(data)}; fit_generator(workers={kwargs['workers']}, "
                f"use_multiprocessing={kwargs['use_multiprocessing']})")
    it = record_iter(data, size, global_batch)  # plain host memory: Keras copies it to numpy
    return ((keras_batches(numpy_batches(stream(it)), labels), {}),
            f"{describe_pipeline(data, size)}; {code('mxnet.keras_numpy_generator')}")


def compile_model(model: Any, spec: Spec, ctxs: list[mx.Context], lr: float,
                  momentum: float = 0.0) -> list[dict[str, Any]]:
    """compile with keras-mxnet's SGD (the rate / N for gradient_reduce mean, see the docstring)
    and the context list; the device records of the contexts keras-mxnet resolved."""
    if spec.options["gradient_reduce"] == "mean":
        lr /= len(ctxs)
    model.compile(optimizer=keras.optimizers.SGD(lr=lr, momentum=momentum),
                  loss="sparse_categorical_crossentropy", context=[str(c) for c in ctxs])
    # keras-mxnet's _get_mxnet_context turns every "cpu(i)" into mx.cpu()
    kind = ("executor on a shared CPU context (keras-mxnet maps cpu(i) to cpu(0))"
            if spec.device == "cpu" else "GPU")
    return [{"name": str(c), "kind": kind} for c in model._context]


def read_placement(model: Any, n: int) -> dict[str, Any]:
    """Where the steps ran: the context and rows of the data array bound to each executor of
    the keras-mxnet Module's train executor group; fewer than N is placement_collapsed."""
    group = model._module._buckets["train"]._exec_group
    data_name = group.data_names[0]
    executors = [(str(e.arg_dict[data_name].context), int(e.arg_dict[data_name].shape[0]))
                 for e in group.execs]
    rows: dict[str, int] = {}
    for ctx, count in executors:
        rows[ctx] = rows.get(ctx, 0) + count
    out: dict[str, Any] = {
        "placement": rows, "placement_executors": [list(e) for e in executors],
        "placement_source": code("mxnet.keras_executor_rows")}
    if len(rows) < n:
        out["placement_collapsed"] = (
            f"keras-mxnet 2.2.4.3 binds the {n} contexts of compile(context=...) as "
            f"{sorted(rows)}: _get_mxnet_context maps every 'cpu(i)' to mx.cpu(); "
            f"{len(executors)} executors, one batch slice each, share it")
    return out


def train(model: Any, spec: Spec, clock: StepClock, arrays: tuple[np.ndarray, np.ndarray] | None,
          fed: tuple[Any, dict[str, Any]] | None = None) -> None:
    """Train the clock's warm-up and measured steps: fit_generator on the real-data source and
    its worker arguments `fed`, else on the arrays repeated; or (input arrays) fit on that many
    copies of the arrays."""
    steps = clock.window.warmup + clock.window.measure
    if spec.options["input"] == "generator":
        source, fit_kwargs = fed if fed is not None else (itertools.repeat(arrays), {})
        model.fit_generator(source, steps_per_epoch=steps, epochs=1, callbacks=[clock],
                            verbose=0, **fit_kwargs)
        return
    assert arrays is not None
    x, y = arrays
    nbytes, total = x.nbytes * steps, os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if nbytes > total // 4:  # every step's batch held in memory: refuse rather than swap
        raise Unavailable(f"input=arrays needs {nbytes / 2**30:.1f} GiB of host arrays, over a "
                          f"quarter of this host's {total / 2**30:.0f} GiB; use input=generator")
    model.fit(np.concatenate([x] * steps), np.concatenate([y] * steps), batch_size=len(x),
              epochs=1, shuffle=False, callbacks=[clock], verbose=0)


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec.options
    ctxs, _ = mxc.contexts(spec)
    n, global_batch = len(ctxs), spec.global_batch_size
    spec.split_batch(n, "contexts")
    warmup, measure = spec.warmup_steps, spec.measure_steps
    model_spec = get_spec(spec.model)
    feed = opts["input"]
    real = spec.data == "real"
    labels: list[int] = []
    if real:
        if feed == "arrays":
            raise Unavailable("input=arrays with real data: fit on arrays decoded before the "
                              "timed window leaves out the input pipeline a real-data run "
                              "times; use input=generator (loader framework or keras)")
        data = open_for_model(spec, model_spec)
        size = model_spec.input_shape[0]
        fed, pipeline = real_feed(spec, data, size, global_batch, warmup + measure, labels)
        arrays = None
    else:
        x, y = mxc.synthetic_arrays(model_spec, global_batch)
        arrays, fed = (x, y.reshape(-1, 1)), None
    model = load_builder(spec.model, "keras")(model_spec, data_format="channels_first")
    devices = compile_model(model, spec, ctxs, 0.01, momentum=0.9)
    clock = StepClock(warmup, measure)
    # keras-mxnet's SGD is an mx.optimizer.SGD: num_update counts the updates it applied
    start = model.optimizer.num_update
    train(model, spec, clock, arrays, fed)
    if not clock.window.losses:
        raise Invalid("no measured step reported a loss")
    updates = model.optimizer.num_update - start - warmup  # the warm-up's updates are not timed
    return join(clock.window.summary(global_batch, updates * global_batch), {
        "loss_kind": "Keras running mean over the epoch (warm-up steps included)",
        "replicas": n, "framework": mxc.framework_versions(), "devices": devices,
        "layout": keras.backend.image_data_format(), "input": feed,
        "gradient_reduce": opts["gradient_reduce"],
        "kvstore": model._kvstore,  # keras-mxnet's default; Model(..., kvstore=) would change it
        "params": k2.count_params_keras2(model), "flops_per_sample": k2.count_flops_keras2(model)},
        read_placement(model, n),
        {**describe(data, size), "loader": opts["loader"], "first_batch_labels": labels,
         "input_pipeline": pipeline} if real else {})


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model through the benchmark's path (compile with the
    context list, then fit_generator or fit as the input option says); weights saved."""
    ctxs, _ = mxc.contexts(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    n = len(ctxs)
    spec.split_batch(n, "contexts", rows=len(x))
    model = load_builder("probe", "keras")(get_spec("probe"), data_format="channels_first")
    k2.set_canonical_weights(model, weights)
    devices = compile_model(model, spec, ctxs, lr)
    arrays = (x.transpose(0, 3, 1, 2), y.reshape(-1, 1))  # inputs come NHWC
    clock = StepClock(0, 1)
    train(model, spec, clock, arrays)
    mx.nd.waitall()
    spec.save_equivalence_output(k2.get_canonical_weights(model))
    return {"replicas": n, "framework": mxc.framework_versions(), "devices": devices,
            "loss": finite(clock.window.losses[0]), "input": spec.options["input"],
            "gradient_reduce": spec.options["gradient_reduce"],
            **read_placement(model, n)}


if __name__ == "__main__":
    main(benchmark, equivalence)
