"""Native TensorFlow: a custom training loop in tf.function under tf.distribute.MirroredStrategy.

The "fast TensorFlow" baseline the seeds measured Keras against (the "Keras tax" is a Keras
runner's images/sec over this one's); what a TF 2 user writes from the TF guides ("Custom
training with tf.distribute.Strategy", TF 2.21). The model from models/ is used only as a layer
graph: no compile, no fit, no callbacks; the step is GradientTape + optimizer in one
tf.function, and each step's loss is read back as a float (the clock needs a finished step;
tf_cnn_benchmarks fetches its loss every step too).

BatchNorm (fused_batchnorm, default true): each Keras BatchNormalization layer of the model is
swapped (keras.models.clone_model, same names, config and canonical weights) for
FusedBatchNormalization, the same layer computed by TF's fused kernel FusedBatchNormV3, as TF 1
layers (fused=True) and tf_cnn_benchmarks compute it. Keras 3 computes BatchNorm from unfused
ops on every backend; on ResNet-50 that cost tf_native a third of its CPU step and put it at
0.79 of tf_cnn_benchmarks (docs/PERFORMANCE.md, "tf_native vs tf_cnn_benchmarks").
fused_batchnorm: false keeps Keras 3's layer. Optimizer: Keras SGD, momentum 0.9, no weight
decay (tf_cnn_benchmarks: plain SGD plus L2 weight decay on its defaults); mode converge
runs the recipe's (below).

Split: each replica gets its own B/N slice of the global batch. Synthetic data is made once,
directly on each replica's device (experimental_distribute_values_from_function), so a step
copies nothing from the host. Real data: tf.data's global batches (runners/tf/data.py) through
experimental_distribute_dataset, which splits each batch and prefetches the slices to the
replicas' devices; the timed steps include the input pipeline. Variables: mirrored, one copy
per device, created under the strategy's scope. Merge: each replica's loss is its per-example
losses summed and divided by the *global* batch (tf.nn.compute_average_loss), so the gradients
MirroredStrategy sums with an all-reduce inside optimizer.apply_gradients (NCCL between GPUs, a
reduction on CPUs) are the gradients of the global mean loss; every replica applies the same
update (synchronous SGD).

Placement: the partition graphs TF instantiated for the first step (runners/tf/placement.py),
compute ops per device, collected around the first warm-up step. xla: the replica step is
jit_compiled; on N > 1 virtual CPU devices XLA runs every replica on its one host device, which
cannot reach the other replicas' variables ("Trying to access resource ... located in
device"): the run is invalid with TF's message, never a pass. The equivalence mode runs this
same path (model path, per-replica input, the same tf.function step, xla) on the probe model.

Mode converge (time to accuracy, runners/converge.py; `converge`): the same loop: the
benchmark's model path (fused_batchnorm), strategy and tf.function step (xla honoured), the
recipe's optimizer, initial weights seeded by keras.utils.set_random_seed(recipe.seed) (the
clone of fused_batchnorm takes the builder's weights, so tf_native starts where tf_mirrored
does: initial_weights_sha256), one step per global batch of runners/converge.py fed through
experimental_distribute_dataset, optimizer.learning_rate assigned before every step. Each step
divides its summed losses by that step's global rows (compute_average_loss), so a short kept
last batch is a mean over its own rows. The held-out accuracy: the model in inference mode
(training=False) under strategy.run, each replica on its share (runners/tf/common.py
StrategyAccuracy); every device's copy of the BatchNorm moving statistics (each replica keeps
its own: aggregation NONE) is read through the strategy after each epoch. What differs: Keras 3
SGD's momentum form (m = momentum x m - lr x g; w += m) and the recipe's weight_decay added to
the gradient (runners/tf/common.py RecipeSGD) where the benchmark runs plain momentum SGD; one
node only.

Several nodes (spec.num_nodes > 1, issue 16): tf.distribute.MultiWorkerMirroredStrategy (TF
2.21), one worker per node as the harness starts them through srun, its cluster resolved by
TF's own tf.distribute.cluster_resolver.SlurmClusterResolver (runners/tf/devices.py). The
step is the same; the all-reduce inside apply_gradients becomes collective ops
(CollectiveReduceV2) across the workers over gRPC. Each replica makes its own slice of the
synthetic batch, seeded by its replica id in sync; real data is sharded by worker (auto-shard
DATA, runners/tf/common.py). Worker 0, the chief, is process rank 0 (checked against
SLURM_PROCID and MGBENCH_PROCESS_RANK) and writes the result; equivalence weights are written
by it alone. Placement: each worker's RunMetadata holds only its own partition graphs, so every
worker's counts, node identity and task are gathered to all by a TF collective all-gather
(strategy.gather) into `placement`, `nodes` and `multi_node`, after the timed window. On CPU
MWMS runs one replica per worker (the worker's CPU device), so more than 1 device per node on
CPU is unavailable. What differs here: the local cluster (docs/SLURM.md) is one machine, node1
and node2 are both 127.0.0.1, and SlurmClusterResolver gives both workers the same port, so the
second gets port_base + 1 (multi_node.port_adjustments; on a real cluster nothing changes).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
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
from runners.common import Invalid, Spec, finite, main, process_rank, timed_loop
from runners.converge import Recipe, load_splits, train_to_accuracy
from runners.real_data import describe
from runners.tf import data as tf_data
from runners.tf.common import (
    EVALUATION,
    POLICIES,
    SHARDING_NOTE,
    StrategyAccuracy,
    check_converge_model,
    empty_replica_failure,
    epoch_dataset,
    framework_versions,
    input_shape,
    local_batch,
    moving_stat_copies,
    moving_stats,
    open_real,
    recipe_optimizer,
    replica_slices,
    setup_devices,
    shard_across_workers,
    weights_digest,
    worker_seed,
)
from runners.tf.devices import MultiWorker, multi_worker_strategy, xla_collectives_unavailable
from runners.tf.placement import BOOKKEEPING_OPS, EagerPlacement

FUSED_MIN_EPSILON = 1.001e-5


class FusedBatchNormalization(keras.layers.BatchNormalization):
    """Keras 3's BatchNormalization computed by TensorFlow's one fused kernel, FusedBatchNormV3
    (and FusedBatchNormGradV3 for its gradient), as TF 1's tf.layers/tf.keras (fused=True) and
    tf_cnn_benchmarks compute it. Keras 3 computes it from unfused ops on every backend (mean,
    squared difference, mean, rsqrt, multiply-adds), whose gradient is ~20 more elementwise
    and reduction ops per layer: a third of tf_native's ResNet-50 CPU step (docs/PERFORMANCE.md).

    Same variables, same arithmetic: normalise by the batch's biased variance, moving statistics
    updated as Keras does (momentum, the *biased* batch variance: the kernel returns the
    unbiased one for its own moving averages, so it is scaled back by (n - 1) / n); epsilon at
    least 1.001e-5, as TF's own fused_batch_norm wrapper sets it for cuDNN. Falls back to
    Keras' call for what the kernel cannot do (not 4-D, a mask, renorm, synchronized)."""

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
        epsilon = max(self.epsilon, FUSED_MIN_EPSILON)
        if training and self.trainable:
            y, mean, unbiased, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                x=x, scale=scale, offset=offset, mean=tf.constant([], tf.float32),
                variance=tf.constant([], tf.float32), epsilon=epsilon,
                exponential_avg_factor=1.0, data_format=fmt, is_training=True)
            shape = tf.shape(x)
            n = tf.cast(tf.reduce_prod(shape) // shape[axis], tf.float32)
            variance = unbiased * ((n - 1.0) / tf.maximum(n, 1.0))
            m = self.momentum
            self.moving_mean.assign(self.moving_mean.value * m + mean * (1.0 - m))
            self.moving_variance.assign(self.moving_variance.value * m + variance * (1.0 - m))
        else:
            y, _, _, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                x=x, scale=scale, offset=offset, mean=tf.cast(self.moving_mean.value, tf.float32),
                variance=tf.cast(self.moving_variance.value, tf.float32),
                epsilon=epsilon, exponential_avg_factor=1.0, data_format=fmt,
                is_training=False)
        return tf.cast(y, self.compute_dtype)


def build_model(model: str, model_spec: ModelSpec, data_format: str,
                fused_batchnorm: bool) -> tuple[keras.Model, int]:
    """The model from models/ (its Keras builder, the layer graph every Keras runner uses);
    with fused_batchnorm, each BatchNormalization layer swapped for FusedBatchNormalization
    (same name and config, so the same canonical weights). Returns the model and how many
    layers were swapped."""
    built = load_builder(model, "keras")(model_spec, data_format=data_format)
    if not fused_batchnorm:
        return built, 0
    swapped = 0

    def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
        nonlocal swapped
        if type(layer) is keras.layers.BatchNormalization:
            swapped += 1
            return FusedBatchNormalization.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    if not any(type(layer) is keras.layers.BatchNormalization for layer in built.layers):
        return built, 0
    cloned = keras.models.clone_model(built, clone_function=clone)
    cloned.set_weights(built.get_weights())  # the builder's initial weights, not fresh ones
    return cloned, swapped


def make_strategy(spec: Spec) -> tuple[tf.distribute.Strategy, list[dict[str, Any]],
                                       MultiWorker | None]:
    """MirroredStrategy over the run's devices (its default all-reduce for those devices); on
    several nodes, MultiWorkerMirroredStrategy over SlurmClusterResolver's cluster (its
    default collective implementation), with what the record needs of it."""
    if spec.num_nodes > 1:
        multi = multi_worker_strategy(spec)
        return multi.strategy, multi.devices, multi
    names, devices = setup_devices(spec)
    return tf.distribute.MirroredStrategy(devices=names), devices, None


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
    global_batch, n = spec.global_batch_size, strategy.num_replicas_in_sync
    if spec.data == "synthetic":
        xy = device_batches(strategy, input_shape(model_spec, data_format),
                            model_spec.num_classes, global_batch // n)
        return itertools.repeat(xy), {
            "data_placement": "one synthetic slice per replica, created on its device once "
                              "(experimental_distribute_values_from_function); no host copy "
                              "per step"}
    data = open_real(spec, model_spec)
    size, channels_first = model_spec.input_shape[0], data_format == "channels_first"
    ds = tf_data.make_dataset(data, size, global_batch, channels_first=channels_first,
                              seed=worker_seed(spec))
    if spec.num_nodes > 1:
        ds = shard_across_workers(ds)
    return iter(strategy.experimental_distribute_dataset(ds)), {
        **describe(data, size),
        "input_pipeline": tf_data.describe_pipeline(data, global_batch, channels_first),
        "labels_first_batch": tf_data.first_labels(ds),
        "data_placement": "global batches from tf.data on the host, split into per-replica "
                          "slices and prefetched to each replica's device by "
                          "experimental_distribute_dataset",
    }


def make_train_step(strategy: tf.distribute.Strategy, model: keras.Model,
                    optimizer: keras.optimizers.Optimizer, global_batch: int | None,
                    xla: bool = False) -> Callable[..., tf.Tensor]:
    """A tf.function running one synchronous step on every replica; returns the global loss.
    `global_batch` None: the step takes the global batch's rows as a third argument (an int32
    tensor: mode converge's short kept last batch divides by its own rows)."""
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def replica_step(x: tf.Tensor, y: tf.Tensor, rows: Any) -> tf.Tensor:
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, probs)
            loss = tf.nn.compute_average_loss(tf.cast(per_example, tf.float32),
                                              global_batch_size=rows)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            target = optimizer.scale_loss(loss) if scaled else loss
        grads = tape.gradient(target, model.trainable_variables)
        # in replica context: the optimizer all-reduces (sums) the gradients, then applies them
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    # nothing in the step needs AutoGraph (no tensor-dependent Python control flow)
    replica_step = tf.autograph.experimental.do_not_convert(replica_step)
    inner = tf.function(replica_step, jit_compile=True) if xla else replica_step

    if global_batch is None:
        @tf.function
        def rows_step(x: Any, y: Any, rows: tf.Tensor) -> tf.Tensor:
            per_replica = strategy.run(inner, args=(x, y, rows))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return rows_step

    @tf.function
    def train_step(x: Any, y: Any) -> tf.Tensor:
        per_replica = strategy.run(inner, args=(x, y, global_batch))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


XLA_DEVICE_ERROR = re.compile(r"Trying to access resource .{0,300}? located in device")


def first_step(step: Callable[..., tf.Tensor], *args: Any
               ) -> tuple[float, dict[str, Any], Any]:
    """Run the step once (the first warm-up step, or the equivalence step) while TF collects
    the partition graphs of the functions it instantiates for it; the loss, the placement and
    the RunMetadata.

    XLA on N virtual CPU devices compiles each replica's step for XLA's one host device, which
    cannot reach the variables of the other replicas: TF raises "Trying to access resource
    ... located in device ...". That is a step that did not run where it was asked to: Invalid,
    with TF's words."""
    placement = EagerPlacement()
    placement.start()
    try:
        loss = finite(step(*args))
    except tf.errors.InvalidArgumentError as exc:
        if XLA_DEVICE_ERROR.search(str(exc)):
            said = next((line.strip() for line in str(exc).splitlines()
                         if "Trying to access resource" in line), "")
            raise Invalid("XLA ran the replicas' step on one device that cannot reach the "
                          f"other replicas' variables: {said[:300]}") from exc
        raise
    except tf.errors.UnimplementedError as exc:  # xla on several workers on CPU
        unavailable = xla_collectives_unavailable(exc)
        if unavailable is not None:
            raise unavailable from exc
        raise
    finally:
        placement.stop()
    # eager run metadata lists each partition graph twice (on its own and under the function
    # it belongs to): count the functions' graphs once
    rm = placement.run_metadata
    graphs = ([g for fg in rm.function_graphs for g in fg.partition_graphs]
              or list(rm.partition_graphs)) if rm is not None else []
    kinds: Counter[str] = Counter()
    for graph in graphs:
        kinds.update(node.op for node in graph.node if node.op not in BOOKKEEPING_OPS)
    return loss, {**placement.result(), "compute_ops_by_type": dict(kinds.most_common())}, rm


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec.options
    policy = POLICIES[spec.precision]
    keras.mixed_precision.set_global_policy(policy)
    strategy, devices, multi = make_strategy(spec)
    model_spec = get_spec(spec.model)
    data_format = opts["data_format"]
    xla = bool(opts["xla"])
    fused = bool(opts["fused_batchnorm"])
    global_batch, n = spec.global_batch_size, strategy.num_replicas_in_sync
    spec.split_batch(n, "replicas")
    with strategy.scope():
        model, swapped = build_model(spec.model, model_spec, data_format, fused)
        optimizer: keras.optimizers.Optimizer = keras.optimizers.SGD(learning_rate=0.01,
                                                                     momentum=0.9)
        if spec.precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    batches, data_info = step_inputs(spec, strategy, model_spec, data_format)
    train_step = make_train_step(strategy, model, optimizer, global_batch, xla)

    # the first step instantiates the step function: its partition graphs are the placement
    # (collected outside the timed window; with no warm-up it is the first timed step's)
    placed: dict[str, Any] = {}
    first: dict[str, Any] = {}
    start = 0

    def step() -> Any:
        if placed:
            return train_step(*next(batches))
        xy = next(batches)
        loss, found, run_metadata = first_step(train_step, *xy)
        placed.update(found)
        if multi is not None:  # the rows this worker's replicas stepped on (evidence of sharding)
            first.update(run_metadata=run_metadata, batch=local_batch(strategy, xy, "the "
                                                                      "first step's input"))
        return loss

    def on_start() -> None:
        nonlocal start
        start = int(optimizer.iterations.numpy())

    # a float read waits for the step to finish on every device
    window = timed_loop(step, finite, spec.warmup_steps, spec.measure_steps, on_start)
    steps = int(optimizer.iterations.numpy()) - start
    result = {
        **window.summary(global_batch, steps * global_batch),
        "loss_kind": "global mean cross-entropy of each step's batch",
        "replicas": n,
        "framework": framework_versions(),
        "devices": devices,
        "layout": data_format,
        "dtype_policy": policy,
        "loss_scaling": spec.precision == "fp16",
        "xla": xla,
        # MirroredStrategy: each replica normalises over its own rows (the summary's BN column)
        "batchnorm": "per_device",
        "batchnorm_kernel": (f"fused: FusedBatchNormV3 in {swapped} layers" if swapped
                      else "none in this model" if fused
                      else "Keras 3 BatchNormalization (unfused ops)"),
        **placed,
        **data_info,
        "params": count_params_keras(model),
        "flops_per_sample": count_flops_keras(model),
    }
    if multi is not None:  # last: a collective every worker joins
        result["input_sharding"] = (
            "synthetic: each replica makes its own global-batch / replicas rows, seeded by its "
            "replica id in sync (experimental_distribute_values_from_function)"
            if spec.data == "synthetic" else SHARDING_NOTE)
        result.update(multi.record(placed["placement"], first["run_metadata"],
                                   {"first_batch": first["batch"]}))
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """The timed path on the probe model: the same strategy, model path (fused_batchnorm),
    per-replica slices made on each replica's device by experimental_distribute_values_from_
    function, and the same tf.function step (xla honoured), for one plain SGD step on the
    given weights and batch split over the replicas; weights saved, placement read back."""
    opts = spec.options
    strategy, devices, multi = make_strategy(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    data_format = opts["data_format"]
    n = strategy.num_replicas_in_sync
    images = np.asarray(x) if data_format == "channels_last" \
        else np.ascontiguousarray(np.transpose(np.asarray(x), (0, 3, 1, 2)))
    with strategy.scope():
        model, _ = build_model("probe", get_spec("probe"), data_format,
                               bool(opts["fused_batchnorm"]))
        set_canonical_weights(model, weights)
        optimizer = keras.optimizers.SGD(learning_rate=lr)
        optimizer.build(model.trainable_variables)
    xs, ys = replica_slices(strategy, images, y)
    step = make_train_step(strategy, model, optimizer, len(x), bool(opts["xla"]))
    loss, placed, run_metadata = first_step(step, xs, ys)
    if process_rank() == 0:  # several workers: each holds the same weights, one writes them
        spec.save_equivalence_output(get_canonical_weights(model))
    result = {"replicas": n, "framework": framework_versions(), "devices": devices,
              "loss": loss, "layout": data_format, **placed}
    if multi is not None:
        result.update(multi.record(placed["placement"], run_metadata,
                                   {"first_batch": local_batch(strategy, (xs, ys),
                                                               "the step's input")}))
    return result


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge (runners/converge.py): the benchmark's model, strategy and tf.function
    step (make_train_step, fused_batchnorm and xla honoured), one step per global batch of
    the recipe fed through experimental_distribute_dataset, the optimizer's learning rate
    assigned before every step; each step divides its replicas' summed losses by its own
    global rows (a short kept last batch included). Held-out accuracy in inference mode under
    the strategy (StrategyAccuracy); BatchNorm moving statistics read from every device's
    copy."""
    opts = spec.options
    recipe = Recipe.of(spec)
    splits = load_splits(spec)
    model_spec = get_spec(spec.model)
    check_converge_model(spec, model_spec, splits)
    policy = POLICIES[spec.precision]
    keras.mixed_precision.set_global_policy(policy)
    strategy, devices, _ = make_strategy(spec)
    data_format, xla, fused = opts["data_format"], bool(opts["xla"]), bool(opts["fused_batchnorm"])
    keras.utils.set_random_seed(recipe.seed)  # the initial weights: alike at any device count
    with strategy.scope():
        model, swapped = build_model(spec.model, model_spec, data_format, fused)
        optimizer: keras.optimizers.Optimizer = recipe_optimizer(recipe)
        if spec.precision == "fp16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(model.trainable_variables)
    initial = weights_digest(model)
    train_step = make_train_step(strategy, model, optimizer, None, xla)
    placed: dict[str, Any] = {}
    lr_read_back: list[float] = []

    def train_epoch(epoch: int, batches: list, lr_at: Callable[[int], float]) -> float:
        inputs = iter(strategy.experimental_distribute_dataset(
            epoch_dataset(batches, data_format)))
        losses = []
        for step, (batch, xy) in enumerate(zip(batches, inputs, strict=False)):
            optimizer.learning_rate = lr_at(step)
            rows = tf.constant(batch.global_rows, tf.int32)
            try:
                if placed:
                    losses.append(float(train_step(*xy, rows)))  # a float: the step finished
                else:  # the first step instantiates the function: its partition graphs
                    loss, found, _ = first_step(train_step, *xy, rows)
                    placed.update(found)
                    losses.append(loss)
            except tf.errors.InvalidArgumentError as exc:
                failure = empty_replica_failure(exc, [batch], strategy.num_replicas_in_sync)
                if failure is None:
                    raise
                raise failure from exc
        if len(losses) != len(batches):
            raise Invalid(f"the distributed dataset gave {len(losses)} of the epoch's "
                          f"{len(batches)} batches")
        lr_read_back.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
        return float(np.mean(losses)) if losses else float("nan")

    result = train_to_accuracy(spec, train_epoch, StrategyAccuracy(strategy, model, data_format),
                               lambda: moving_stats(strategy, model), splits=splits)
    return {
        **result,
        # read back from the optimizer after each epoch: the rate its last step ran at
        "lr_read_back": lr_read_back,
        # every device's copy of every BatchNorm moving statistic, as moving_stats reads them
        "moving_stat_copies": len(moving_stat_copies(strategy, model)),
        "replicas": strategy.num_replicas_in_sync,
        "framework": framework_versions(),
        "devices": devices,
        "layout": data_format,
        "dtype_policy": policy,
        "loss_scaling": spec.precision == "fp16",
        "xla": xla,
        "batchnorm": "per_device",
        "batchnorm_kernel": (f"fused: FusedBatchNormV3 in {swapped} layers" if swapped
                             else "none in this model" if fused
                             else "Keras 3 BatchNormalization (unfused ops)"),
        **placed,
        "data_placement": "each epoch's global batches of the recipe (runners/converge.py) in "
                          "tf.data on the host, split into per-replica slices and prefetched "
                          "to each replica's device by experimental_distribute_dataset",
        "optimizer": "Keras 3 SGD (m = momentum x m - lr x g; w += m), the recipe's "
                     "weight_decay added to the gradient (runners/tf/common.py RecipeSGD)",
        "lr_setting": "optimizer.learning_rate assigned before each step",
        "train_loss_kind": "the mean over the epoch's steps of each step's global mean "
                           "cross-entropy",
        "evaluation": EVALUATION,
        "initial_weights_sha256": initial,
        "params": count_params_keras(model),
        "flops_per_sample": count_flops_keras(model),
    }


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
