"""TensorFlow-family child code shared by the Keras 3 TF runners: data, timing of Keras fit,
the converge adapter. Imports TensorFlow and Keras 3: child processes only."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from contract.precision_policy import resolve
from contract.reasons import code
from contract.result import join  # noqa: E402
from models import ModelSpec, get_spec, load_builder  # noqa: E402
from models.keras_common import get_canonical_weights, set_canonical_weights  # noqa: E402
from runners.common import Invalid, Spec, TimedWindow, Unavailable, one_line, rows_per_device  # noqa: E402
from runners.converge import Batch, Splits, train_to_accuracy  # noqa: E402
from runners.memory import _itemsize  # noqa: E402
from runners.real_data import describe  # noqa: E402
from runners.tf import data as tf_data  # noqa: E402
from runners.tf.devices import MultiWorker, multi_worker_strategy, setup_devices  # noqa: E402
from runners.tf.placement import all_gather_json, device_key  # noqa: E402

POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def framework_versions() -> dict[str, str]:
    return {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__}


def make_strategy(spec: Spec, cross_device_ops: Callable[[], Any] | None = None,
                  communication: str = "auto",
                  multi_class: type[tf.distribute.MultiWorkerMirroredStrategy]
                  = tf.distribute.MultiWorkerMirroredStrategy
                  ) -> tuple[tf.distribute.Strategy, list[dict[str, Any]], MultiWorker | None]:
    """MirroredStrategy over the run's devices (all-reduce by `cross_device_ops()`, None: its
    default); on several nodes `multi_class` (MultiWorkerMirroredStrategy, collective
    `communication`), with what the record needs of it."""
    if spec.num_nodes > 1:
        multi = multi_worker_strategy(spec, communication, multi_class)
        return multi.strategy, multi.devices, multi
    names, devices = setup_devices(spec)
    cross = cross_device_ops() if cross_device_ops else None
    return tf.distribute.MirroredStrategy(devices=names, cross_device_ops=cross), devices, None


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
    """(PerReplica x, PerReplica y): replica i's equal rows of a host batch, made on its device;
    Invalid when the rows do not divide over the replicas."""
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
    """One random batch of int32 token ids, the same in every run: (inputs, next tokens)."""
    ids = tf.random.stateless_uniform((batch, seq_len + 1), seed=(5, 6), maxval=vocab,
                                      dtype=tf.int32)
    return ids[:, :-1], ids[:, 1:]


def global_batch_dataset(batch: Any, repeat: bool = True) -> tf.data.Dataset:
    """A dataset of one global batch (repeated, or once), split over replicas, not sharded."""
    ds = tf.data.Dataset.from_tensors(batch)
    return tf_data.auto_shard(ds.repeat() if repeat else ds)


def worker_seed(spec: Spec) -> int | None:
    """The real-data shuffle seed: on several nodes one seed every worker shares (the same
    global batches, each worker keeping its slice: auto-shard DATA), None on one node."""
    return 20240616 if spec.num_nodes > 1 else None


SHARDING_NOTE = code("tf.multi_worker_sharding")


def shard_across_workers(ds: tf.data.Dataset) -> tf.data.Dataset:
    """A dataset of global batches for a multi-worker strategy: auto-shard policy DATA, each
    worker keeping its replicas' slices of every global batch (SHARDING_NOTE)."""
    return tf_data.auto_shard(ds, tf.data.experimental.AutoShardPolicy.DATA)


def local_batch(strategy: tf.distribute.Strategy, xy: Any, source: str) -> dict[str, Any]:
    """What this worker's replicas got of one step's (PerReplica x, PerReplica y): rows per local
    replica, sums of the images and labels; `source` says which batch it was."""
    xs = strategy.experimental_local_results(xy[0])
    ys = strategy.experimental_local_results(xy[1])
    return {"source": source, "rows": [int(x.shape[0]) for x in xs],
            "image_sum": round(float(sum(np.asarray(x, np.float64).sum() for x in xs)), 4),
            "label_sum": int(sum(np.asarray(y, np.int64).sum() for y in ys))}


def fit_input(spec: Spec, model_spec: ModelSpec, data_format: str, steps: int
              ) -> tuple[Any, dict[str, Any]]:
    """What a Keras runner's fit trains on and its record: one random global batch, repeated, or
    the `loader`'s global batches (framework: tf.data; keras: the PyDataset, `steps` long)."""
    batch = spec.global_batch_size
    if spec.data == "synthetic":
        return global_batch_dataset(synthetic_batch(input_shape(model_spec, data_format),
                                                    model_spec.num_classes, batch)), {}
    data = tf_data.open_real(spec, model_spec)
    size, channels_first = model_spec.input_shape[0], data_format == "channels_first"
    loader = spec.options["loader"]
    if loader == "keras":
        from runners.keras_data import describe_keras, jpeg_sequence

        source: Any = jpeg_sequence(data, size, batch, steps, channels_first)
        info = {"input_pipeline": describe_keras(data),
                "labels_first_batch": [int(v) for v in source[0][1]]}
    else:  # framework (the catalog's choices: framework, keras)
        source = tf_data.make_dataset(data, size, batch, channels_first=channels_first,
                                      seed=worker_seed(spec))
        info = {"input_pipeline": tf_data.describe_pipeline(data, batch, channels_first),
                "labels_first_batch": tf_data.first_labels(source)}
    return source, {**describe(data, size), "loader": loader, **info}


class FitClock(keras.callbacks.Callback):
    """Drives the timed window of a model.fit call, one call of `per_call` steps per batch end;
    reading the loss as a float waits for the step to finish on the device."""

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
    """model.fit for warmup + measure steps on a repeating dataset: the timing summary, samples
    from the optimizer's step counter; `callbacks` run before the clock's at every batch end."""
    warmup, measure = spec.warmup_steps, spec.measure_steps
    clock = FitClock(warmup, measure, per_call)
    model.fit(data, epochs=1, steps_per_epoch=warmup + measure, callbacks=[*callbacks, clock],
              verbose=0, shuffle=False)
    steps = int(model.optimizer.iterations.numpy()) - clock.start_iteration
    return {
        **clock.window.summary(spec.global_batch_size, steps * spec.global_batch_size),
        "loss_kind": "Keras running mean over the epoch (warm-up steps included)",
    }


# ---- the model state each device holds under tf.distribute: the distributed variables'
# per-device components (parameters, optimizer state, gradients as the trainable weights) ----

def _per_device(variables: Any) -> dict[str, int]:
    """Bytes each device holds of `variables`: a distributed variable's per-device values."""
    held: dict[str, int] = {}
    for v in variables:
        inner = getattr(v, "value", v)  # a Keras 3 Variable -> the tf variable
        values = getattr(inner, "values", None)
        for part in (values if values is not None else [inner]):
            nbytes = math.prod(int(d) for d in part.shape) * _itemsize(part.dtype)
            key = device_key(part.device)
            held[key] = held.get(key, 0) + nbytes
    return held


def _whole(variables: Any) -> int:
    return sum(math.prod(int(d) for d in v.shape) * _itemsize(v.dtype) for v in variables)


def state_bytes_tf(model: Any) -> dict[str, Any]:
    """state_bytes_per_device, state_bytes_global and state_source of a Keras model trained
    under a tf.distribute strategy (its optimizer: model.optimizer)."""
    optimizer = getattr(model, "optimizer", None)
    opt_vars = list(getattr(optimizer, "variables", None) or ())
    params, grads = _per_device(model.weights), _per_device(model.trainable_weights)
    opt = _per_device(opt_vars)
    devices = sorted(set(params) | set(opt))
    return {
        "state_bytes_per_device": {d: {"params": params.get(d, 0), "grads": grads.get(d, 0),
                                       "optimizer": opt.get(d, 0)} for d in devices},
        "state_bytes_global": {"params": _whole(model.weights),
                               "grads": _whole(model.trainable_weights),
                               "optimizer": _whole(opt_vars)},
        "state_source": code("tf.distributed_variables_state"),
    }


def keras_policy(model: Any, precision: str) -> dict[str, Any]:
    """The record's precision_policy of a compiled Keras 3 model, read back from it (dtype policy,
    variables' dtype, loss scaling; gradients reduced in the trainable variables' dtype)."""
    policy = model.dtype_policy
    optimizer = getattr(model, "optimizer", None)
    scaled = type(optimizer).__name__ == "LossScaleOptimizer"
    variable = model.trainable_weights[0].dtype if model.trainable_weights else None
    return {"precision_policy": resolve(
        precision, how=f"keras dtype policy {policy.name!r} (keras.mixed_precision)"
        + ("; compile's LossScaleOptimizer" if scaled else ""),
        compute=policy.compute_dtype, params=variable or policy.variable_dtype,
        reduce=variable or policy.variable_dtype,
        loss_scaling="dynamic" if scaled else None)}


# ---- mode converge (runners/converge.py): what tf_mirrored and tf_native share -------------

class RecipeSGD(keras.optimizers.SGD):
    """Keras 3 SGD with momentum and the recipe's weight_decay as an L2 term added to each
    gradient (torch's meaning; Keras' own is decoupled), after the all-reduce."""

    def __init__(self, l2: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.l2 = float(l2)

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if self.l2:
            gradient = tf.cast(gradient, variable.dtype) + tf.cast(self.l2, variable.dtype) \
                * tf.convert_to_tensor(variable)
        super().update_step(gradient, variable, learning_rate)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "l2": self.l2}


def recipe_optimizer(recipe: Any) -> RecipeSGD:
    """The recipe's SGD (momentum, weight decay), its rate 0 until the loop (or fit's callback)
    sets the recipe's before every step: a step it did not set would not train."""
    if recipe.optimizer != "sgd":
        raise Unavailable(f"converge optimizer {recipe.optimizer!r}: only sgd is built")
    return RecipeSGD(l2=recipe.weight_decay, learning_rate=0.0, momentum=recipe.momentum)


def check_converge_model(spec: Spec, model_spec: ModelSpec, splits: Any,
                         across_nodes: bool = False) -> None:
    """Unavailable unless the model takes the dataset's images and classes (mode converge
    trains on its splits: runners/converge.py) and is built to converge here (one node, or
    several where the runner says `across_nodes`)."""
    if spec.num_nodes > 1 and not across_nodes:
        raise Unavailable("mode converge on several nodes: of the TF runners only "
                          "tf_mirrored feeds each worker its share of the recipe's batches")
    if model_spec.input_kind == "tokens":
        raise Unavailable(f"mode converge trains on images; {spec.model} takes tokens")
    shape = tuple(splits.x_train.shape[1:])
    if tuple(model_spec.input_shape) != shape:
        raise Unavailable(f"{spec.model} takes {tuple(model_spec.input_shape)} images; the "
                          f"dataset's are {shape}")
    if model_spec.num_classes < splits.classes:
        raise Unavailable(f"{spec.model} has {model_spec.num_classes} classes; the dataset "
                          f"has {splits.classes}")


def nchw(x: np.ndarray, data_format: str) -> np.ndarray:
    """Images (B, H, W, C) in the model's layout."""
    return x if data_format == "channels_last" else np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def replica_pieces(batches: Sequence[Batch], replicas: int) -> list[Batch]:
    """Each batch cut into `replicas` equal slices of consecutive rows, in order (what a
    distributed iterator gives a worker's replicas of a batch); Invalid when one does not
    divide."""
    out = []
    for b in batches:
        per = rows_per_device(len(b.y), replicas, "local replicas", "worker's share")
        out += [Batch(x=b.x[i * per:(i + 1) * per], y=b.y[i * per:(i + 1) * per],
                      global_rows=b.global_rows) for i in range(replicas)]
    return out


def epoch_dataset(batches: Sequence[Any], data_format: str) -> tf.data.Dataset:
    """One epoch's global batches (runners.converge.Batch, in order) as a tf.data dataset, each
    split by a strategy's distributed iterator (auto-shard OFF); a short last batch stays short."""
    shape = nchw(batches[0].x[:0], data_format).shape[1:] if batches else (None,) * 3

    def generate() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for b in batches:
            yield nchw(b.x, data_format), b.y

    return tf_data.auto_shard(tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((None, *shape), tf.float32), tf.TensorSpec((None,), tf.int32))))


def moving_stat_copies(strategy: tf.distribute.Strategy, model: keras.Model
                       ) -> list[tuple[str, str, np.ndarray]]:
    """(variable path, device, values) of every BatchNorm moving mean and variance on every
    device (experimental_local_results: under MirroredStrategy each replica keeps its own)."""
    out = []
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.BatchNormalization):
            for var in (layer.moving_mean, layer.moving_variance):
                for copy in strategy.experimental_local_results(var.value):
                    out.append((var.path, copy.device, np.asarray(copy)))
    return out


def moving_stats(strategy: tf.distribute.Strategy, model: keras.Model) -> tuple[bool, str]:
    """(all finite, the first that is not) of moving_stat_copies."""
    copies = moving_stat_copies(strategy, model)
    for path, device, values in copies:
        bad = int(values.size - np.isfinite(values).sum())
        if bad:
            return False, f"{path} on {device}: {bad} of {values.size} values not finite"
    return True, f"{len(copies)} moving statistics (every device's copy) finite"


EVAL_ROWS = 1024  # held-out rows per evaluation call, over all replicas


class StrategyAccuracy:
    """Top-1 accuracy in inference mode on the held-out split, each replica on its share
    (strategy.run, counts summed); the split is cut once into EVAL_ROWS calls and kept."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model,
                 data_format: str) -> None:
        self.strategy, self.model, self.data_format = strategy, model, data_format
        self.calls: list[tuple[Any, Any]] = []
        self.rows = 0

        def replica(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            probs = model(x, training=False)
            hits = tf.equal(tf.argmax(probs, axis=-1, output_type=tf.int32), y)
            return tf.reduce_sum(tf.cast(hits, tf.int32))

        @tf.function
        def correct(x: Any, y: Any) -> tf.Tensor:
            per_replica = strategy.run(replica, args=(x, y))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        self.correct = correct

    def _prepare(self, x: np.ndarray, y: np.ndarray) -> None:
        n = self.strategy.num_replicas_in_sync
        images = nchw(x, self.data_format)
        for start in range(0, len(y), EVAL_ROWS):
            xc, yc = images[start:start + EVAL_ROWS], y[start:start + EVAL_ROWS]
            shares = np.array_split(np.arange(len(yc)), n)

            def share(ctx: tf.distribute.experimental.ValueContext, xc: np.ndarray = xc,
                      yc: np.ndarray = yc, shares: list = shares) -> tuple[Any, Any]:
                rows = shares[ctx.replica_id_in_sync_group]
                return tf.constant(xc[rows]), tf.constant(yc[rows].astype(np.int32))

            self.calls.append(self.strategy.experimental_distribute_values_from_function(share))
        self.rows = len(y)

    def __call__(self, x: np.ndarray, y: np.ndarray) -> float:
        if not self.calls:
            self._prepare(x, y)
        elif len(y) != self.rows:
            raise ValueError(f"the held-out split changed: {len(y)} rows, was {self.rows}")
        hits = sum(int(self.correct(*xy)) for xy in self.calls)
        return hits / self.rows


class StrategyConverge:
    """Mode converge's adapter for a Keras 3 model under a tf.distribute strategy: a subclass's
    `train` runs one epoch; this class reads the rate back, evaluates, reads BatchNorm
    statistics. Several workers (`worker`: this one's index, `workers` their number): each
    trains on its share of every global batch, and the moving statistics' check and count are
    gathered from every worker (collectives every worker joins at the same points)."""

    def __init__(self, strategy: tf.distribute.Strategy, model: keras.Model,
                 optimizer: keras.optimizers.Optimizer, data_format: str) -> None:
        self.strategy, self.model, self.data_format = strategy, model, data_format
        self.optimizer = optimizer
        self.initial = weights_digest(model)  # before any step: where every run starts
        self.lr_read_back: list[float] = []
        self.worker, self.workers = 0, 1

    def train(self, epoch: int, batches: list[Any], lr_at: Callable[[int], float]) -> float:
        raise NotImplementedError

    def train_epoch(self, epoch: int, batches: list[Any], lr_at: Callable[[int], float]
                    ) -> float:
        loss = self.train(epoch, batches, lr_at)
        # read back from the optimizer after each epoch: the rate its last step ran at
        self.lr_read_back.append(float(keras.ops.convert_to_numpy(
            self.optimizer.learning_rate)))
        return loss

    @contextlib.contextmanager
    def empty_replicas(self, batches: Sequence[Any]) -> Iterator[None]:
        """A step failed on `batches` where a replica got no rows (a short kept last batch of
        fewer rows than replicas: seed 002's trap) re-raised Invalid, saying why."""
        try:
            yield
        except tf.errors.InvalidArgumentError as exc:
            replicas = self.strategy.num_replicas_in_sync
            short = [b.global_rows for b in batches if b.global_rows < replicas]
            if not short:
                raise
            raise Invalid(
                f"a replica got no rows of the short kept last batch ({short[0]} row(s) over "
                f"{replicas} replicas) and TensorFlow failed on its empty slice "
                f"({one_line(str(exc), 160)}): oneDNN's CPU Conv2D gives an empty batch the "
                "wrong shape; without oneDNN the replica's BatchNorm moving statistics become "
                "NaN") from exc

    def moving_stats(self) -> tuple[bool, str]:
        """moving_stats of this worker's copies; several workers: of every worker's, gathered
        through the strategy, so that every worker stops after the same epoch."""
        finite, detail = moving_stats(self.strategy, self.model)
        if self.workers == 1:
            return finite, detail
        found = all_gather_json(self.strategy, [finite, detail])
        bad = [f"worker {i}: {said}" for i, (ok, said) in enumerate(found) if not ok]
        if bad:
            return False, "; ".join(bad)
        return True, f"{self.stat_copies()} moving statistics (every worker's device copies) finite"

    def stat_copies(self) -> int:
        """The BatchNorm moving statistics' copies on every device of every worker."""
        local = len(moving_stat_copies(self.strategy, self.model))
        return local if self.workers == 1 else sum(all_gather_json(self.strategy, local))

    def run(self, spec: Spec, splits: Splits, policy: str) -> dict[str, Any]:
        """train_to_accuracy's result, on this worker's share of the batches, and the fields
        both runners report."""
        result = train_to_accuracy(
            spec, self.train_epoch, StrategyAccuracy(self.strategy, self.model, self.data_format),
            self.moving_stats, self.worker, self.workers, splits)
        return join(result, {
            "lr_read_back": self.lr_read_back,
            # every device's copy of every BatchNorm moving statistic, as moving_stats reads
            "moving_stat_copies": self.stat_copies(),
            "dtype_policy": policy,
            "batchnorm": "per_device",
            "optimizer": code("tf.keras3_sgd_weight_decay"),
            "evaluation": code("tf.strategy_evaluation"),
            "initial_weights_sha256": self.initial})


def weights_digest(model: keras.Model) -> str:
    """sha256 of the model's canonical weights, in order: two runs start alike."""
    digest = hashlib.sha256()
    for name, value in sorted(get_canonical_weights(model).items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(value, np.float32).tobytes())
    return digest.hexdigest()

