"""The custom-loop step of the TF runners without fit: one tf.function running the replica step
on every replica, its inputs made on each device, its first call collecting the placement."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from runners.common import Invalid, finite
from runners.tf.devices import xla_collectives_guard
from runners.tf.placement import BOOKKEEPING_OPS, eager_placement


def device_batches(strategy: tf.distribute.Strategy, shape: tuple[int, ...], classes: int,
                   per_replica: int) -> tuple[Any, Any]:
    """One random (images, labels) slice per replica, created on that replica's device."""

    def make(ctx: tf.distribute.experimental.ValueContext) -> tuple[tf.Tensor, tf.Tensor]:
        rid = ctx.replica_id_in_sync_group
        x = tf.random.stateless_normal((per_replica, *shape), seed=(1, 2 + rid))
        y = tf.random.stateless_uniform((per_replica,), seed=(3, 4 + rid), maxval=classes,
                                        dtype=tf.int32)
        return x, y

    return strategy.experimental_distribute_values_from_function(make)  # (PerReplica x, y)


def make_train_step(strategy: tf.distribute.Strategy, model: keras.Model,
                    optimizer: keras.optimizers.Optimizer, global_batch: int | None,
                    xla: bool = False) -> Callable[..., tf.Tensor]:
    """A tf.function running one synchronous step on every replica, returning the global loss;
    `global_batch` None: the step takes the batch's rows as a third (int32 tensor) argument."""
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

    @tf.function
    def train_step(x: Any, y: Any, rows: Any = global_batch) -> tf.Tensor:
        per_replica = strategy.run(inner, args=(x, y, rows))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train_step


XLA_DEVICE_ERROR = re.compile(r"Trying to access resource .{0,300}? located in device")


def first_step(step: Callable[..., tf.Tensor], *args: Any
               ) -> tuple[float, dict[str, Any], Any]:
    """Run the step once while TF collects its partition graphs: (loss, placement, RunMetadata);
    XLA's "Trying to access resource" on N virtual CPU devices raised Invalid."""
    try:
        with eager_placement() as placement, xla_collectives_guard():
            loss = finite(step(*args))
    except tf.errors.InvalidArgumentError as exc:
        if XLA_DEVICE_ERROR.search(str(exc)):
            said = next((line.strip() for line in str(exc).splitlines()
                         if "Trying to access resource" in line), "")
            raise Invalid("XLA ran the replicas' step on one device that cannot reach the "
                          f"other replicas' variables: {said[:300]}") from exc
        raise
    # eager run metadata lists each partition graph twice: count the functions' graphs once
    rm = placement.run_metadata
    graphs = ([g for fg in rm.function_graphs for g in fg.partition_graphs]
              or list(rm.partition_graphs)) if rm is not None else []
    kinds: Counter[str] = Counter()
    for graph in graphs:
        kinds.update(node.op for node in graph.node if node.op not in BOOKKEEPING_OPS)
    return loss, {**placement.result(), "compute_ops_by_type": dict(kinds.most_common())}, rm
