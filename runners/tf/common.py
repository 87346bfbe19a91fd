"""TensorFlow-family child code shared by the TF runners: devices, data (synthetic, or real
through runners/tf/data.py or the Keras loader), timing of Keras fit.

Imports TensorFlow and Keras 3: only runner child processes import this module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models import ModelSpec, get_spec, load_builder  # noqa: E402
from models.keras_common import set_canonical_weights  # noqa: E402
from runners.common import Spec, TimedWindow, Unavailable, rows_per_device  # noqa: E402
from runners.real_data import RealData, check_classes, describe, open_dataset  # noqa: E402
from runners.tf import data as tf_data  # noqa: E402
from runners.tf.devices import setup_devices  # noqa: E402  (re-exported)

POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def framework_versions() -> dict[str, str]:
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__}


def mirrored_model(spec: Spec, model: str, lr: float, momentum: float,
                   weights: dict[str, np.ndarray] | None = None
                   ) -> tuple[tf.distribute.MirroredStrategy, list[dict[str, Any]], keras.Model,
                              keras.optimizers.Optimizer]:
    """(MirroredStrategy over the run's devices, their descriptions, the Keras model `model`
    from models/ (channels_last; `weights`: canonical weights to start from), Keras SGD with
    its variables built), the variables mirrored on every device (made under the scope)."""
    names, devices = setup_devices(spec)
    strategy = tf.distribute.MirroredStrategy(devices=names)
    with strategy.scope():
        net = load_builder(model, "keras")(get_spec(model))
        if weights is not None:
            set_canonical_weights(net, weights)
        optimizer = keras.optimizers.SGD(learning_rate=lr, momentum=momentum)
        optimizer.build(net.trainable_variables)
    return strategy, devices, net, optimizer


def replica_slices(strategy: tf.distribute.Strategy, x: np.ndarray, y: np.ndarray
                   ) -> tuple[Any, Any]:
    """(PerReplica x, PerReplica y): replica i's equal rows of a host batch, made on its device
    (experimental_distribute_values_from_function), as the synthetic slices are; Invalid when
    the rows do not divide over the replicas."""
    per = rows_per_device(len(x), strategy.num_replicas_in_sync, "replicas",
                          "equivalence batch")

    def slice_of(ctx: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, tf.Tensor]:
        rows = slice(ctx.replica_id_in_sync_group * per, (ctx.replica_id_in_sync_group + 1) * per)
        return tf.constant(np.asarray(x[rows])), tf.constant(np.asarray(y[rows]))

    return strategy.experimental_distribute_values_from_function(slice_of)


def input_shape(model_spec: ModelSpec, data_format: str) -> tuple[int, int, int]:
    """The model's input shape in the given layout."""
    h, w, c = model_spec.input_shape
    return (h, w, c) if data_format == "channels_last" else (c, h, w)


def synthetic_batch(shape: tuple[int, ...], classes: int, batch: int) -> tuple[tf.Tensor,
                                                                               tf.Tensor]:
    """One random batch (images, integer labels), the same in every run."""
    x = tf.random.stateless_normal((batch, *shape), seed=(1, 2))
    y = tf.random.stateless_uniform((batch,), seed=(3, 4), maxval=classes, dtype=tf.int32)
    return x, y


def synthetic_tokens(seq_len: int, vocab: int, batch: int) -> tuple[tf.Tensor, tf.Tensor]:
    """One random batch of token ids, the same in every run: ids (batch, seq_len + 1) in
    [0, vocab), int32 inputs ids[:, :-1] and next-token targets ids[:, 1:]."""
    ids = tf.random.stateless_uniform((batch, seq_len + 1), seed=(5, 6), maxval=vocab,
                                      dtype=tf.int32)
    return ids[:, :-1], ids[:, 1:]


def synthetic_dataset(shape: tuple[int, ...], classes: int, batch: int,
                      repeat: bool = True) -> tf.data.Dataset:
    """One synthetic global batch, repeated; not sharded when a strategy distributes it."""
    return global_batch_dataset(synthetic_batch(shape, classes, batch), repeat)


def global_batch_dataset(batch: Any, repeat: bool = True) -> tf.data.Dataset:
    """A dataset of one given global batch (repeated, or once), which a strategy's distributed
    iterator splits into per-replica slices instead of sharding the dataset."""
    ds = tf.data.Dataset.from_tensors(batch)
    ds = ds.repeat() if repeat else ds
    options = tf.data.Options()
    # each element is already one global batch: split it, do not shard the dataset by file
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


# the shuffle seed every worker of a multi-node run shares (worker_seed)
MULTI_WORKER_SEED = 20240616


def worker_seed(spec: Spec) -> int | None:
    """The real-data shuffle seed: one seed shared by every worker on several nodes, so that
    each worker's tf.data pipeline makes the same global batches and auto-shard DATA gives
    each worker its own slice of the same batch; None (a fresh shuffle) on one node. With
    dataset workers > 1 the parallel reads and decodes are not ordered (deterministic=False
    in runners/tf/data.py), so the workers' batches can still differ in order."""
    return MULTI_WORKER_SEED if spec.num_nodes > 1 else None


SHARDING_NOTE = (
    "each element is one global batch; MultiWorkerMirroredStrategy's distributed dataset "
    "rebatches it into one slice per replica of every worker and, with auto-shard policy "
    "DATA, each worker keeps only its own replicas' slices (with OFF every worker would "
    "train on the same rows)")


def shard_across_workers(ds: tf.data.Dataset) -> tf.data.Dataset:
    """A dataset of global batches for a multi-worker strategy: auto-shard policy DATA, so
    each worker keeps its replicas' slices of every global batch (SHARDING_NOTE), where one
    machine's MirroredStrategy takes OFF (one input pipeline splits each batch)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(options)


def local_batch(strategy: tf.distribute.Strategy, xy: Any, source: str) -> dict[str, Any]:
    """What this worker's replicas got of one step's (PerReplica x, PerReplica y): rows per
    local replica, and sums of the images and labels (different workers, different rows);
    `source` says which batch it was."""
    xs = strategy.experimental_local_results(xy[0])
    ys = strategy.experimental_local_results(xy[1])
    return {"source": source, "rows": [int(x.shape[0]) for x in xs],
            "image_sum": round(float(sum(np.asarray(x, np.float64).sum() for x in xs)), 4),
            "label_sum": int(sum(np.asarray(y, np.int64).sum() for y in ys))}


def open_real(spec: Spec, model_spec: ModelSpec) -> RealData:
    """The run's prepared dataset, checked against the model; Unavailable for any data other
    than synthetic and real."""
    if spec.data != "real":
        raise Unavailable(f"data {spec.data!r} is neither synthetic nor real")
    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
    return data


def fit_input(spec: Spec, model_spec: ModelSpec, data_format: str, steps: int
              ) -> tuple[Any, dict[str, Any]]:
    """What a Keras runner's fit trains on, and what the record says about it.

    Synthetic: one random global batch, repeated (no fields added). Real: the `loader`
    option's pipeline over the run's dataset, giving global batches: "framework" is tf.data
    over the TFRecord shards (runners/tf/data.py), "keras" the Keras 3 PyDataset over the JPEG
    file list (runners/keras/data.py, `steps` batches long)."""
    batch = spec.global_batch_size
    if spec.data == "synthetic":
        return synthetic_dataset(input_shape(model_spec, data_format), model_spec.num_classes,
                                 batch), {}
    data = open_real(spec, model_spec)
    size, channels_first = model_spec.input_shape[0], data_format == "channels_first"
    loader = spec.options["loader"]
    if loader == "keras":
        from runners.keras.data import describe_keras, jpeg_sequence

        source: Any = jpeg_sequence(data, size, batch, steps, channels_first)
        info = {"input_pipeline": describe_keras(data),
                "labels_first_batch": [int(v) for v in source[0][1]]}
    elif loader == "framework":
        source = tf_data.make_dataset(data, size, batch, channels_first=channels_first,
                                      seed=worker_seed(spec))
        info = {"input_pipeline": tf_data.describe_pipeline(data, batch, channels_first),
                "labels_first_batch": tf_data.first_labels(source)}
    else:
        raise Unavailable(f"loader {loader!r} is neither framework nor keras")
    return source, {**describe(data, size), "loader": loader, **info}


class FitClock(keras.callbacks.Callback):
    """Drives the timed window of a model.fit call (runners.common.TimedWindow), one call of
    `per_call` steps per batch end. Reading the loss as a Python float waits for the step to
    finish on the device, so each clock reading follows a synchronised step."""

    def __init__(self, warmup: int, measure: int, per_call: int = 1) -> None:
        super().__init__()
        self.window = TimedWindow(warmup, measure, per_call, on_start=self._start)
        self.start_iteration = 0

    def _start(self) -> None:
        self.start_iteration = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.window.step_begin()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.window.step_done(float((logs or {})["loss"]))


def timed_fit(spec: Spec, model: keras.Model, data: Any, per_call: int = 1, *,
              callbacks: Sequence[keras.callbacks.Callback] = ()) -> dict[str, Any]:
    """Run model.fit for warmup + measure steps on data (a repeating dataset) and return the
    timing summary, the samples counted from the optimizer's step counter, and the losses.
    `callbacks` run before the clock's at every batch end (so what they do at the last warm-up
    batch stays outside the timed window)."""
    warmup, measure = spec.warmup_steps, spec.measure_steps
    clock = FitClock(warmup, measure, per_call)
    model.fit(data, epochs=1, steps_per_epoch=warmup + measure, callbacks=[*callbacks, clock],
              verbose=0, shuffle=False)
    steps = int(model.optimizer.iterations.numpy()) - clock.start_iteration
    return {
        **clock.window.summary(spec.global_batch_size, steps * spec.global_batch_size),
        "loss_kind": "Keras running mean over the epoch (warm-up steps included)",
    }
