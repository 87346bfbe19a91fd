"""Native TensorFlow: a custom training loop in tf.function under tf.distribute.MirroredStrategy.

The "fast TensorFlow" baseline the seeds measured Keras against (the "Keras tax" is a Keras
runner's images/sec over this one's). The model from models/ is used only as a layer graph:
no compile, no fit, no callbacks; the step is GradientTape + optimizer in one tf.function.

Split: each replica gets its own B/N slice of the global batch. Synthetic data is made once,
directly on each replica's device (experimental_distribute_values_from_function), so a step
copies nothing from the host. Real data: tf.data's global batches (runners/tf_data.py) through
experimental_distribute_dataset, which splits each batch and prefetches the slices to the
replicas' devices; the timed steps include the input pipeline. Variables: mirrored, one copy
per device, created under the strategy's scope. Merge: each replica's loss is its per-example
losses summed and divided by the *global* batch (tf.nn.compute_average_loss), so the gradients
MirroredStrategy sums with an all-reduce inside optimizer.apply_gradients (NCCL between GPUs, a
reduction on CPUs) are the gradients of the global mean loss; every replica applies the same
update (synchronous SGD).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models import ModelSpec, get_spec, load_builder
from models.keras_common import (
    count_flops_keras,
    count_params_keras,
    get_canonical_weights,
    set_canonical_weights,
)
from runners import tf_data
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
from runners.real_data import describe
from runners.tf_common import (
    POLICIES,
    framework_versions,
    input_shape,
    open_real,
    setup_devices,
)


def make_strategy(spec: Spec) -> tuple[tf.distribute.MirroredStrategy, list[dict[str, Any]]]:
    """MirroredStrategy over the run's devices (its default all-reduce for those devices)."""
    names, devices = setup_devices(spec)
    return tf.distribute.MirroredStrategy(devices=names), devices


def device_batches(strategy: tf.distribute.Strategy, shape: tuple[int, ...], classes: int,
                   per_replica: int) -> tuple[Any, Any]:
    """One random (images, labels) slice per replica, created on that replica's device."""

    def make(ctx: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, tf.Tensor]:
        rid = ctx.replica_id_in_sync_group
        x = tf.random.stateless_normal((per_replica, *shape), seed=(1, 2 + rid))
        y = tf.random.stateless_uniform((per_replica,), seed=(3, 4 + rid), maxval=classes,
                                        dtype=tf.int32)
        return x, y

    values = strategy.experimental_distribute_values_from_function(make)
    return values  # a (PerReplica x, PerReplica y) pair


def step_inputs(spec: Spec, strategy: tf.distribute.Strategy, model_spec: ModelSpec,
                data_format: str) -> tuple[Iterator[tuple[Any, Any]], dict[str, Any]]:
    """Each step's (PerReplica x, PerReplica y), and what the record says about the data.

    Synthetic: the same slices made once on each device. Real: the tf.data pipeline's global
    batches through strategy.experimental_distribute_dataset, which splits each batch into
    per-replica slices and prefetches them to the replicas' devices."""
    global_batch, n = spec["global_batch_size"], strategy.num_replicas_in_sync
    if spec["data"] == "synthetic":
        xy = device_batches(strategy, input_shape(model_spec, data_format),
                            model_spec.num_classes, global_batch // n)
        return itertools.repeat(xy), {
            "data_placement": "one synthetic slice per replica, created on its device once "
                              "(experimental_distribute_values_from_function); no host copy "
                              "per step"}
    data = open_real(spec, model_spec)
    size, channels_first = model_spec.input_shape[0], data_format == "channels_first"
    ds = tf_data.make_dataset(data, size, global_batch, channels_first=channels_first)
    return iter(strategy.experimental_distribute_dataset(ds)), {
        **describe(data, size),
        "input_pipeline": tf_data.describe_pipeline(data, global_batch, channels_first),
        "labels_first_batch": tf_data.first_labels(ds),
        "data_placement": "global batches from tf.data on the host, split into per-replica "
                          "slices and prefetched to each replica's device by "
                          "experimental_distribute_dataset",
    }


def make_train_step(strategy: tf.distribute.Strategy, model: keras.Model,
                    optimizer: keras.optimizers.Optimizer, global_batch: int,
                    xla: bool = False) -> Callable[[Any, Any], tf.Tensor]:
    """A tf.function running one synchronous step on every replica; returns the global loss."""
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def replica_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, probs)
            loss = tf.nn.compute_average_loss(tf.cast(per_example, tf.float32),
                                              global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            target = optimizer.scale_loss(loss) if scaled else loss
        grads = tape.gradient(target, model.trainable_variables)
        # in replica context: the optimizer all-reduces (sums) the gradients, then applies them
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    inner = tf.function(replica_step, jit_compile=True) if xla else replica_step

    @tf.function
    def train_step(x: Any, y: Any) -> tf.Tensor:
        per_replica = strategy.run(inner, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec["options"]
    policy = POLICIES[spec["precision"]]
    keras.mixed_precision.set_global_policy(policy)
    strategy, devices = make_strategy(spec)
    model_spec = get_spec(spec["model"])
    data_format = opts.get("data_format", "channels_last")
    xla = bool(opts.get("xla", False))
    global_batch, n = spec["global_batch_size"], strategy.num_replicas_in_sync
    if xla and spec["device"] == "cpu" and n > 1:
        # seen on TF 2.21: "Trying to access resource stem_conv/kernel/replica_1 located in
        # device CPU:1 from device CPU:0" (XLA known issue tfvariable_on_a_different_device)
        raise Unavailable("xla on more than one virtual CPU device: the jit-compiled step of "
                          "replica 1 runs on XLA's one host device (CPU:0) and cannot reach "
                          "its variables on /cpu:1; use xla with 1 CPU device or on GPUs")
    if global_batch % n:
        raise Invalid(f"global batch {global_batch} does not divide by {n} replicas")
    with strategy.scope():
        model = load_builder(spec["model"], "keras")(model_spec, data_format=data_format)
        optimizer: keras.optimizers.Optimizer = keras.optimizers.SGD(learning_rate=0.01,
                                                                     momentum=0.9)
        if spec["precision"] == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    batches, data_info = step_inputs(spec, strategy, model_spec, data_format)
    train_step = make_train_step(strategy, model, optimizer, global_batch, xla)

    for _ in range(spec["warmup_steps"]):
        # a float read waits for the step to finish on every device
        finite(train_step(*next(batches)))
    timer, losses = StepTimer(), []
    start = int(optimizer.iterations.numpy())
    timer.start()
    for _ in range(spec["measure_steps"]):
        losses.append(finite(train_step(*next(batches))))
        timer.tick()
    steps = int(optimizer.iterations.numpy()) - start
    if not losses:
        raise Invalid("measure_steps is 0: nothing was timed")
    return {
        **timer.summary(global_batch, steps * global_batch),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "loss_kind": "global mean cross-entropy of each step's batch",
        "replicas": n,
        "framework": framework_versions(),
        "devices": devices,
        "layout": data_format,
        "dtype_policy": policy,
        "loss_scaling": spec["precision"] == "fp16",
        "xla": xla,
        **data_info,
        "params": count_params_keras(model),
        "flops_per_sample": count_flops_keras(model),
    }


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model, the batch split over the replicas; weights saved."""
    strategy, devices = make_strategy(spec)
    weights, x, y, lr = load_equivalence_inputs(spec)
    n = strategy.num_replicas_in_sync
    if len(x) % n:
        raise Invalid(f"equivalence batch {len(x)} does not divide by {n} replicas")
    per = len(x) // n
    with strategy.scope():
        model = load_builder("probe", "keras")(get_spec("probe"))
        set_canonical_weights(model, weights)
        optimizer = keras.optimizers.SGD(learning_rate=lr)
        optimizer.build(model.trainable_variables)

    def slice_of(ctx: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, tf.Tensor]:
        i = ctx.replica_id_in_sync_group
        return (tf.constant(np.asarray(x[i * per:(i + 1) * per])),
                tf.constant(np.asarray(y[i * per:(i + 1) * per])))

    xs, ys = strategy.experimental_distribute_values_from_function(slice_of)
    loss = make_train_step(strategy, model, optimizer, len(x))(xs, ys)
    finite(loss)
    save_equivalence_output(spec, get_canonical_weights(model))
    return {"replicas": n, "framework": framework_versions(), "devices": devices,
            "loss": float(loss)}


if __name__ == "__main__":
    main(benchmark, equivalence)
