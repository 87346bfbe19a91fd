"""Native TensorFlow: a custom training loop in tf.function under MirroredStrategy
(MultiWorkerMirroredStrategy across nodes), the no-Keras-fit baseline of the "Keras tax":
GradientTape + Keras SGD, gradients all-reduced in apply_gradients; fused_batchnorm uses TF's
FusedBatchNormV3 as TF 1 did. Differs from tf_cnn_benchmarks: no L2 weight decay.
docs/runners/tf_native.md has the details."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from contract.reasons import code
from contract.result import join
from models import ModelSpec, get_spec, load_builder
from models import keras_common as kc
from runners.common import Invalid, Spec, finite, main, process_rank, timed_loop
from runners.converge import Recipe, load_splits
from runners.real_data import describe
from runners.tf import common as tfc
from runners.tf import data as tf_data
from runners.tf.devices import MultiWorker
from runners.tf.steps import device_batches, first_step, make_train_step


class FusedBatchNormalization(keras.layers.BatchNormalization):
    """Keras 3's BatchNormalization computed by TF's FusedBatchNormV3 as TF 1 computes it; Keras'
    call for what the kernel cannot do (docs/runners/tf_native.md, "FusedBatchNormalization")."""

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        axis = self.axis % len(inputs.shape)
        if (len(inputs.shape) != 4 or axis not in (1, 3) or mask is not None or self.renorm
                or self.synchronized):
            return super().call(inputs, training=training, mask=mask)
        channels = inputs.shape[axis]
        x = tf.convert_to_tensor(inputs)
        if x.dtype not in (tf.float16, tf.bfloat16, tf.float32):
            x = tf.cast(x, tf.float32)
        scale = (tf.cast(self.gamma.value, tf.float32) if self.scale
                 else tf.ones((channels,), tf.float32))
        offset = (tf.cast(self.beta.value, tf.float32) if self.center
                  else tf.zeros((channels,), tf.float32))
        fmt = "NHWC" if axis == 3 else "NCHW"
        # cuDNN's minimum epsilon, raised as tf.nn.fused_batch_norm raises it (1e-5 -> 1.001e-5)
        epsilon = max(self.epsilon, 1.001e-5)
        fused = {"x": x, "scale": scale, "offset": offset, "epsilon": epsilon,
                 "exponential_avg_factor": 1.0, "data_format": fmt}
        if training and self.trainable:
            y, mean, unbiased, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                mean=tf.constant([], tf.float32), variance=tf.constant([], tf.float32),
                is_training=True, **fused)
            shape = tf.shape(x)
            n = tf.cast(tf.reduce_prod(shape) // shape[axis], tf.float32)
            variance = unbiased * ((n - 1.0) / tf.maximum(n, 1.0))
            m = self.momentum
            self.moving_mean.assign(self.moving_mean.value * m + mean * (1.0 - m))
            self.moving_variance.assign(self.moving_variance.value * m + variance * (1.0 - m))
        else:
            y, _, _, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                mean=tf.cast(self.moving_mean.value, tf.float32),
                variance=tf.cast(self.moving_variance.value, tf.float32), is_training=False,
                **fused)
        return tf.cast(y, self.compute_dtype)


def build_model(model: str, model_spec: ModelSpec, data_format: str,
                fused_batchnorm: bool) -> tuple[keras.Model, int]:
    """The model from models/ and how many BatchNormalization layers were swapped for
    FusedBatchNormalization (same name and config, so the same canonical weights)."""
    built = load_builder(model, "keras")(model_spec, data_format=data_format)
    if not fused_batchnorm or not any(type(layer) is keras.layers.BatchNormalization
                                      for layer in built.layers):
        return built, 0
    swapped = 0

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        nonlocal swapped
        if type(layer) is keras.layers.BatchNormalization:
            swapped += 1
            return FusedBatchNormalization.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    cloned = keras.models.clone_model(built, clone_function=clone)
    cloned.set_weights(built.get_weights())  # the builder's initial weights, not fresh ones
    return cloned, swapped


def step_inputs(spec: Spec, strategy: tf.distribute.Strategy, model_spec: ModelSpec,
                data_format: str) -> tuple[Iterator[tuple[Any, Any]], dict[str, Any]]:
    """Each step's (PerReplica x, PerReplica y) and the data's record: synthetic slices made once
    on each device, or tf.data's global batches split by experimental_distribute_dataset."""
    global_batch, n = spec.global_batch_size, strategy.num_replicas_in_sync
    if spec.data == "synthetic":
        xy = device_batches(strategy, tfc.input_shape(model_spec, data_format),
                            model_spec.num_classes, global_batch // n)
        return itertools.repeat(xy), {
            "data_placement": code("tf.native_synthetic_slices")}
    data = tf_data.open_real(spec, model_spec)
    size, channels_first = model_spec.input_shape[0], data_format == "channels_first"
    ds = tf_data.make_dataset(data, size, global_batch, channels_first=channels_first,
                              seed=tfc.worker_seed(spec))
    if spec.num_nodes > 1:
        ds = tfc.shard_across_workers(ds)
    return iter(strategy.experimental_distribute_dataset(ds)), {
        **describe(data, size),
        "input_pipeline": tf_data.describe_pipeline(data, global_batch, channels_first),
        "labels_first_batch": tf_data.first_labels(ds),
        "data_placement": code("tf.native_real_per_replica"),
    }


class NativeModel:
    """The run's model and optimizer made under its strategy, as benchmark and converge build it
    (dtype policy, fused_batchnorm, loss scaling at fp16), and the record fields they share;
    with `weights` the equivalence test's probe at those weights (no loss scaling)."""

    def __init__(self, spec: Spec, strategy: tf.distribute.Strategy,
                 devices: list[dict[str, Any]],
                 make_optimizer: Callable[[], keras.optimizers.Optimizer],
                 weights: dict[str, np.ndarray] | None = None) -> None:
        opts = spec.options
        self.spec, self.strategy, self.devices = spec, strategy, devices
        self.data_format, self.xla = opts["data_format"], bool(opts["xla"])
        self.fused = bool(opts["fused_batchnorm"])
        model = spec.model if weights is None else "probe"
        with strategy.scope():
            self.model, self.swapped = build_model(model, get_spec(model), self.data_format,
                                                   self.fused)
            if weights is not None:
                kc.set_canonical_weights(self.model, weights)
            optimizer = make_optimizer()
            if spec.precision == "fp16" and weights is None:
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(self.model.trainable_variables)
        self.optimizer = optimizer

    def fields(self, placed: dict[str, Any]) -> dict[str, Any]:
        """What benchmark and converge both report of the model, the strategy and the step."""
        swapped = self.swapped
        return join({
            "replicas": self.strategy.num_replicas_in_sync,
            "framework": tfc.framework_versions(),
            "devices": self.devices,
            "layout": self.data_format,
            "loss_scaling": self.spec.precision == "fp16",
            "xla": self.xla,
            "batchnorm_kernel": (f"fused: FusedBatchNormV3 in {swapped} layers" if swapped
                                 else "none in this model" if self.fused
                                 else "Keras 3 BatchNormalization (unfused ops)"),
            "params": kc.count_params_keras(self.model),
            "flops_per_sample": kc.count_flops_keras(self.model),
        }, placed)


class TimedSteps:
    """The benchmark's step for timed_loop: the first call runs first_step (the placement; on
    several workers also this worker's rows); the step count from the optimizer's iterations."""

    def __init__(self, train_step: Callable[..., tf.Tensor], batches: Iterator[Any],
                 net: NativeModel, multi: MultiWorker | None) -> None:
        self.train_step, self.batches, self.net, self.multi = train_step, batches, net, multi
        self.placed: dict[str, Any] = {}
        self.first: dict[str, Any] = {}
        self.start = 0

    def step(self) -> Any:
        if self.placed:
            return self.train_step(*next(self.batches))
        xy = next(self.batches)
        loss, found, run_metadata = first_step(self.train_step, *xy)
        self.placed.update(found)
        if self.multi is not None:  # the rows this worker's replicas stepped on (sharding)
            self.first.update(run_metadata=run_metadata, batch=tfc.local_batch(
                self.net.strategy, xy, "the first step's input"))
        return loss

    def on_start(self) -> None:
        self.start = self.iterations()

    def iterations(self) -> int:
        return int(self.net.optimizer.iterations.numpy())


def benchmark(spec: Spec) -> dict[str, Any]:
    policy = tfc.POLICIES[spec.precision]
    keras.mixed_precision.set_global_policy(policy)
    strategy, devices, multi = tfc.make_strategy(spec)
    model_spec = get_spec(spec.model)
    global_batch, n = spec.global_batch_size, strategy.num_replicas_in_sync
    spec.split_batch(n, "replicas")
    net = NativeModel(spec, strategy, devices,
                      lambda: keras.optimizers.SGD(learning_rate=0.01, momentum=0.9))
    batches, data_info = step_inputs(spec, strategy, model_spec, net.data_format)
    train_step = make_train_step(strategy, net.model, net.optimizer, global_batch, net.xla)
    steps = TimedSteps(train_step, batches, net, multi)
    # a float read waits for the step to finish on every device
    window = timed_loop(steps.step, finite, spec.warmup_steps, spec.measure_steps,
                        steps.on_start)
    done = steps.iterations() - steps.start
    result = join(window.summary(global_batch, done * global_batch), {
        "loss_kind": "global mean cross-entropy of each step's batch",
        "dtype_policy": policy,
        # MirroredStrategy: each replica normalises over its own rows (the summary's BN column)
        "batchnorm": "per_device"}, net.fields(steps.placed), data_info)
    if multi is not None:  # last: a collective every worker joins
        result["input_sharding"] = (
            code("tf.native_synthetic_sharding")
            if spec.data == "synthetic" else tfc.SHARDING_NOTE)
        result.update(multi.record(steps.placed["placement"], steps.first["run_metadata"],
                                   {"first_batch": steps.first["batch"]}))
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model through the timed path (strategy, fused_batchnorm,
    per-device slices, the same tf.function step, xla); weights saved, placement read back."""
    strategy, devices, multi = tfc.make_strategy(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    net = NativeModel(spec, strategy, devices, lambda: keras.optimizers.SGD(learning_rate=lr),
                      weights)
    xs, ys = tfc.replica_slices(strategy, tfc.nchw(np.asarray(x), net.data_format), y)
    step = make_train_step(strategy, net.model, net.optimizer, len(x), net.xla)
    loss, placed, run_metadata = first_step(step, xs, ys)
    if process_rank() == 0:  # several workers: each holds the same weights, one writes them
        spec.save_equivalence_output(kc.get_canonical_weights(net.model))
    result = {"replicas": strategy.num_replicas_in_sync, "framework": tfc.framework_versions(),
              "devices": devices, "loss": loss, "layout": net.data_format, **placed}
    if multi is not None:
        result.update(multi.record(placed["placement"], run_metadata,
                                   {"first_batch": tfc.local_batch(strategy, (xs, ys),
                                                                   "the step's input")}))
    return result


class NativeConverge(tfc.StrategyConverge):
    """One step of the benchmark's tf.function per recipe batch (experimental_distribute_dataset),
    the rate set before every step, each step's loss over its own global rows."""

    def __init__(self, net: NativeModel) -> None:
        super().__init__(net.strategy, net.model, net.optimizer, net.data_format)
        self.net = net
        self.train_step = make_train_step(net.strategy, net.model, net.optimizer, None,
                                          net.xla)
        self.placed: dict[str, Any] = {}

    def step(self, xy: Any, rows: tf.Tensor) -> float:
        if self.placed:
            return float(self.train_step(*xy, rows))  # a float: the step finished
        loss, found, _ = first_step(self.train_step, *xy, rows)  # its partition graphs
        self.placed.update(found)
        return loss

    def train(self, epoch: int, batches: list, lr_at: Callable[[int], float]) -> float:
        inputs = iter(self.strategy.experimental_distribute_dataset(
            tfc.epoch_dataset(batches, self.data_format)))
        losses = []
        for step, (batch, xy) in enumerate(zip(batches, inputs, strict=False)):
            self.optimizer.learning_rate = lr_at(step)
            with self.empty_replicas([batch]):
                losses.append(self.step(xy, tf.constant(batch.global_rows, tf.int32)))
        if len(losses) != len(batches):
            raise Invalid(f"the distributed dataset gave {len(losses)} of the epoch's "
                          f"{len(batches)} batches")
        return float(np.mean(losses)) if losses else float("nan")


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: NativeConverge on the benchmark's model, strategy and step with the
    recipe's optimizer, initial weights seeded by keras.utils.set_random_seed(recipe.seed)."""
    recipe = Recipe.of(spec)
    splits = load_splits(spec)
    tfc.check_converge_model(spec, get_spec(spec.model), splits)
    policy = tfc.POLICIES[spec.precision]
    keras.mixed_precision.set_global_policy(policy)
    strategy, devices, _ = tfc.make_strategy(spec)
    keras.utils.set_random_seed(recipe.seed)  # the initial weights: alike at any device count
    adapter = NativeConverge(NativeModel(spec, strategy, devices,
                                         lambda: tfc.recipe_optimizer(recipe)))
    result = adapter.run(spec, splits, policy)
    return join(result, adapter.net.fields(adapter.placed), {
        "data_placement": code("tf.native_converge_per_replica"),
        "lr_setting": "optimizer.learning_rate assigned before each step",
        "train_loss_kind": "the mean over the epoch's steps of each step's global mean "
                           "cross-entropy"})


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
