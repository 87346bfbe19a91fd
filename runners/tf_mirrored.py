"""Keras 3 on TensorFlow, data parallel with tf.distribute.MirroredStrategy.

Split: one replica of the model per device, variables mirrored on every device; the
distributed tf.data iterator cuts each global batch into equal per-replica slices.
Reduce: each replica computes gradients on its slice; Keras scales the loss by 1/replicas and
MirroredStrategy sums the gradients with an all-reduce (NCCL between GPUs by default,
collective ops or a reduction to one device on CPUs). Synchronise: every replica applies the
same summed update in the same step, so the replicas never diverge (synchronous SGD).

Synthetic data: one random global batch made once in the tf.data pipeline and prefetched to
each replica's device by the distributed iterator (no decoding, no host-side work per step).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from runners.common import (
    Invalid,
    Spec,
    StepTimer,
    Unavailable,
    finite,
    load_equivalence_inputs,
    main,
    save_equivalence_output,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from models import get_spec, load_builder  # noqa: E402
from models.keras_common import (  # noqa: E402
    count_flops_keras,
    count_params_keras,
    get_canonical_weights,
    set_canonical_weights,
)

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def make_strategy(spec: Spec) -> tuple[tf.distribute.Strategy, list[dict[str, Any]]]:
    """MirroredStrategy over N virtual CPU devices or the first N GPUs."""
    n = spec["num_devices"]
    if spec["device"] == "cpu":
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        names = [f"/cpu:{i}" for i in range(n)]
        devices = [{"name": name, "kind": "virtual CPU device"} for name in names]
    else:
        gpus = tf.config.list_physical_devices("GPU")
        if len(gpus) < n:
            raise Unavailable(f"needs {n} GPUs; TensorFlow sees {len(gpus)}")
        for gpu in gpus[:n]:
            tf.config.experimental.set_memory_growth(gpu, True)
        names = [f"/gpu:{i}" for i in range(n)]
        devices = [{"name": name,
                    "kind": tf.config.experimental.get_device_details(gpu).get("device_name")}
                   for name, gpu in zip(names, gpus[:n], strict=False)]
    choice = spec["options"].get("cross_device_ops", "auto")
    cross = {
        "auto": None,
        "nccl": tf.distribute.NcclAllReduce,
        "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
        "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
    }[choice]
    strategy = tf.distribute.MirroredStrategy(devices=names,
                                              cross_device_ops=cross() if cross else None)
    return strategy, devices


def framework_versions() -> dict[str, str]:
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__}


def synthetic_dataset(shape: tuple[int, ...], classes: int, batch: int,
                      repeat: bool = True) -> tf.data.Dataset:
    x = tf.random.stateless_normal((batch, *shape), seed=(1, 2))
    y = tf.random.stateless_uniform((batch,), seed=(3, 4), maxval=classes, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensors((x, y))
    ds = ds.repeat() if repeat else ds
    options = tf.data.Options()
    # each element is already one global batch: split it, do not shard the dataset by file
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


class _Clock(keras.callbacks.Callback):
    """Marks the timed window. Reading the loss as a Python float waits for the step to
    finish on the device, so each clock reading follows a synchronised step."""

    def __init__(self, warmup: int, per_call: int, timer: StepTimer) -> None:
        super().__init__()
        self.warmup, self.per_call, self.timer = warmup, per_call, timer
        self.losses: list[float] = []
        self.start_iteration = 0

    def _start(self) -> None:
        self.start_iteration = int(self.model.optimizer.iterations.numpy())
        self.timer.start()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self.warmup == 0 and batch == 0:
            self._start()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        loss = float((logs or {})["loss"])
        done = batch + 1
        if done == self.warmup:
            self._start()
        elif done > self.warmup:
            self.timer.tick(self.per_call)
            self.losses.append(loss)


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec["options"]
    per_call = opts.get("steps_per_execution", 1)
    warmup, measure = spec["warmup_steps"], spec["measure_steps"]
    if warmup % per_call or measure % per_call:
        raise Invalid(f"steps_per_execution={per_call} must divide warmup_steps={warmup} and "
                      f"measure_steps={measure} so the timed window starts and ends on a call")
    if spec["data"] != "synthetic":
        raise Unavailable(f"data {spec['data']!r} is not supported by this runner yet")
    keras.mixed_precision.set_global_policy(POLICIES[spec["precision"]])
    strategy, devices = make_strategy(spec)
    model_spec = get_spec(spec["model"])
    data_format = opts.get("data_format", "channels_last")
    h, w, c = model_spec.input_shape
    shape = (h, w, c) if data_format == "channels_last" else (c, h, w)
    with strategy.scope():
        model = load_builder(spec["model"], "keras")(model_spec, data_format=data_format)
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
            steps_per_execution=per_call,
            jit_compile=bool(opts.get("xla", False)),
        )
    timer = StepTimer()
    clock = _Clock(warmup, per_call, timer)
    ds = synthetic_dataset(shape, model_spec.num_classes, spec["global_batch_size"])
    model.fit(ds, epochs=1, steps_per_epoch=warmup + measure, callbacks=[clock], verbose=0,
              shuffle=False)
    samples = (int(model.optimizer.iterations.numpy()) - clock.start_iteration) \
        * spec["global_batch_size"]
    if not clock.losses:
        raise Invalid("no measured step reported a loss")
    return {
        **timer.summary(spec["global_batch_size"], samples),
        "first_loss": finite(clock.losses[0]),
        "last_loss": finite(clock.losses[-1]),
        "loss_kind": "Keras running mean over the epoch (warm-up steps included)",
        "replicas": strategy.num_replicas_in_sync,
        "framework": framework_versions(),
        "devices": devices,
        "layout": data_format,
        "dtype_policy": POLICIES[spec["precision"]],
        "xla": bool(opts.get("xla", False)),
        "cross_device_ops": type(strategy.extended._cross_device_ops).__name__
        if getattr(strategy.extended, "_cross_device_ops", None) else "default",
        "data_placement": "one synthetic batch in tf.data, prefetched to each replica's device",
        "params": count_params_keras(model),
        "flops_per_sample": count_flops_keras(model),
    }


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model over the spec's devices; weights saved after."""
    strategy, devices = make_strategy(spec)
    weights, x, y, lr = load_equivalence_inputs(spec)
    with strategy.scope():
        model = load_builder("probe", "keras")(get_spec("probe"))
        set_canonical_weights(model, weights)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr),
                      loss="sparse_categorical_crossentropy")
    ds = tf.data.Dataset.from_tensors((x, y))
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    model.fit(ds.with_options(options), epochs=1, steps_per_epoch=1, verbose=0, shuffle=False)
    save_equivalence_output(spec, get_canonical_weights(model))
    return {"replicas": strategy.num_replicas_in_sync, "framework": framework_versions(),
            "devices": devices}


if __name__ == "__main__":
    main(benchmark, equivalence)
