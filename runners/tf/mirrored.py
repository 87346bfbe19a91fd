"""Keras 3 on TensorFlow, data parallel with tf.distribute.MirroredStrategy.

Split: one replica of the model per device, variables mirrored on every device; the
distributed tf.data iterator cuts each global batch into equal per-replica slices.
Reduce: each replica computes gradients on its slice; Keras scales the loss by 1/replicas and
MirroredStrategy sums the gradients with an all-reduce (NCCL between GPUs by default,
collective ops or a reduction to one device on CPUs). Synchronise: every replica applies the
same summed update in the same step, so the replicas never diverge (synchronous SGD).

Synthetic data: one random global batch made once in the tf.data pipeline and prefetched to
each replica's device by the distributed iterator (no decoding, no host-side work per step).
Real data (option `loader`): "framework" is tf.data over the TFRecord shards
(runners/tf/data.py), "keras" the Keras 3 PyDataset over the JPEG files (runners/keras/data.py,
worker processes); either gives global batches that the distributed iterator splits.

Follows TensorFlow 2.21's MirroredStrategy with Keras 3's `fit` (its own train function: one
`strategy.run` per step, or a `tf.while_loop` of them with `steps_per_execution` > 1; with
`xla` Keras 3 jit-compiles that whole per-step function, `strategy.run` included).
Placement: the compute ops per device in the partition graphs TensorFlow made for fit's train
function, collected while its first call (a warm-up call) instantiates it and stopped before
the timed window (runners/tf/placement.py).
Limits of this stack at 2+ replicas, reported as unavailable with TensorFlow's message (see
known_limits): `xla` (Keras 3 compiles strategy.run whole, XLA cannot reach the other replicas'
variables; tf.keras 2 compiled each replica's step instead), and `steps_per_execution` > 1 with
the default CollectiveAllReduce (fails inside Keras' while loop; reduction_to_one_device and
hierarchical_copy run). channels_first is unavailable on CPU (TF's CPU conv gradient is NHWC
only); `nccl` needs GPUs.
Equivalence runs the benchmark's path: the same compile (steps_per_execution, jit_compile,
data_format, all-reduce) and the same distributed tf.data input of global batches, fed the
test's one batch once, so fit runs exactly one step (with steps_per_execution > 1, inside the
multi-step while loop, which stops when the iterator is exhausted).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from models import get_spec, load_builder
from models.keras_common import (
    count_flops_keras,
    count_params_keras,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import (
    Invalid,
    Spec,
    Unavailable,
    main,
    one_line,
)
from runners.tf.common import (
    POLICIES,
    fit_input,
    framework_versions,
    global_batch_dataset,
    setup_devices,
    timed_fit,
)
from runners.tf.placement import EagerPlacement

DATA_PLACEMENT = {
    "synthetic": "one synthetic batch in tf.data, prefetched to each replica's device",
    "real": "global batches from the input pipeline on the host; Keras' distributed iterator "
            "splits each into per-replica slices and prefetches them to the replicas' devices",
}
CROSS_DEVICE_OPS = {
    "auto": None,
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
}


def make_strategy(spec: Spec) -> tuple[tf.distribute.Strategy, list[dict[str, Any]]]:
    """MirroredStrategy over the run's devices, with the configured all-reduce."""
    choice = spec.options["cross_device_ops"]
    if choice == "nccl" and spec.device == "cpu":
        raise Unavailable("cross_device_ops nccl: NCCL all-reduces between GPUs; this run is on "
                          "CPU devices")
    if spec.options["data_format"] == "channels_first" and spec.device == "cpu":
        raise Unavailable("data_format channels_first on CPU devices: TensorFlow's CPU kernel "
                          "for Conv2D's filter gradient (Conv2DCustomBackpropFilterOp) only "
                          "supports NHWC")
    names, devices = setup_devices(spec)
    cross = CROSS_DEVICE_OPS[choice]
    strategy = tf.distribute.MirroredStrategy(devices=names,
                                              cross_device_ops=cross() if cross else None)
    return strategy, devices


def cross_device_ops_used(strategy: tf.distribute.Strategy) -> str:
    """The all-reduce class MirroredStrategy uses (for auto: the one it chose itself)."""
    ops = getattr(strategy.extended, "_cross_device_ops", None)
    return type(ops).__name__ if ops is not None else "default"


def build_compiled(spec: Spec, strategy: tf.distribute.Strategy, model_name: str,
                   optimizer: Callable[[], keras.optimizers.Optimizer]) -> keras.Model:
    """The model and its optimizer (made under the strategy), compiled as the benchmark
    compiles it (layout, steps_per_execution, XLA from the options)."""
    opts = spec.options
    with strategy.scope():
        model = load_builder(model_name, "keras")(
            get_spec(model_name), data_format=opts["data_format"])
        model.compile(optimizer=optimizer(), loss="sparse_categorical_crossentropy",
                      steps_per_execution=opts["steps_per_execution"],
                      jit_compile=bool(opts["xla"]))
    return model


class StopPlacement(keras.callbacks.Callback):
    """Stops collecting the train function's partition graphs at the end of fit's first call
    (the function is instantiated then; the later calls run the same one)."""

    def __init__(self, placement: EagerPlacement) -> None:
        super().__init__()
        self.placement = placement

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.placement.stop()


@contextlib.contextmanager
def known_limits(spec: Spec, strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Two failures of Keras 3 fit under MirroredStrategy with 2+ replicas that are the stack's
    limits, not this run's, reported as unavailable with TensorFlow's own words:
    - xla: Keras 3 jit-compiles its whole step function, `strategy.run` over every replica
      included, as one XLA cluster on the first device, and XLA cannot read variables placed
      on another device ("Trying to access resource ... located in device").
    - steps_per_execution > 1 with CollectiveAllReduce (MirroredStrategy's own choice, `auto`):
      the collective all-reduce inside Keras' multi-step tf.while_loop leaves a placeholder
      unfed ("You must feed a value for placeholder tensor 'while/..."); the reduction-to-one-
      device and hierarchical-copy all-reduces run that loop."""
    try:
        yield
    except tf.errors.InvalidArgumentError as exc:
        message, replicas = str(exc), strategy.num_replicas_in_sync
        if replicas > 1 and spec.options["xla"] and "Trying to access resource" in message:
            raise Unavailable(
                f"xla with {replicas} replicas: Keras {keras.__version__} jit-compiles the "
                "whole step (strategy.run over every replica) as one XLA cluster, which cannot "
                "read the other replicas' variables (TensorFlow: "
                f"{xla_resource_error(message)})") from exc
        per_call = spec.options["steps_per_execution"]
        if (replicas > 1 and per_call > 1 and "must feed a value for placeholder" in message
                and "while/" in message):
            raise Unavailable(
                f"steps_per_execution={per_call} with {replicas} replicas and "
                f"{cross_device_ops_used(strategy)}: TensorFlow {tf.__version__} fails inside "
                f"Keras {keras.__version__}'s multi-step while loop "
                f"({one_line(message.split('INVALID_ARGUMENT:')[-1], 120)}); "
                "cross_device_ops reduction_to_one_device or hierarchical_copy run it") from exc
        raise


def xla_resource_error(message: str) -> str:
    """The device pair of TensorFlow's "Trying to access resource" error, in one line."""
    m = re.search(r"Trying to access resource (\S+).*?located in device (\S+) from device "
                  r"(\S+)", message, re.S)
    if not m:
        return one_line(message, 160)
    return f"resource {m[1]} located in device {m[2]} accessed from device {m[3]}"


def compile_info(spec: Spec, strategy: tf.distribute.Strategy, devices: list[dict[str, Any]]
                 ) -> dict[str, Any]:
    opts = spec.options
    return {
        "replicas": strategy.num_replicas_in_sync,
        "framework": framework_versions(),
        "devices": devices,
        "layout": opts["data_format"],
        "steps_per_execution": opts["steps_per_execution"],
        "xla": bool(opts["xla"]),
        "cross_device_ops": cross_device_ops_used(strategy),
    }


def benchmark(spec: Spec) -> dict[str, Any]:
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    strategy, devices = make_strategy(spec)
    model_spec = get_spec(spec.model)
    model = build_compiled(spec, strategy, spec.model,
                           lambda: keras.optimizers.SGD(learning_rate=0.01, momentum=0.9))
    data_format = spec.options["data_format"]
    data, data_info = fit_input(spec, model_spec, data_format,
                                spec.warmup_steps + spec.measure_steps)
    placement = EagerPlacement()
    placement.start()  # before fit's first call, which instantiates its train function
    with known_limits(spec, strategy):
        timed = timed_fit(spec, model, data, spec.options["steps_per_execution"],
                          callbacks=[StopPlacement(placement)])
    return {
        **timed,
        **compile_info(spec, strategy, devices),
        **placement.result(),
        "dtype_policy": POLICIES[spec.precision],
        "data_placement": DATA_PLACEMENT[spec.data],
        **data_info,
        "params": count_params_keras(model),
        "flops_per_sample": count_flops_keras(model),
    }


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model, compiled and fed as the benchmark does; the
    weights saved after it."""
    strategy, devices = make_strategy(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    model = build_compiled(spec, strategy, "probe", lambda: keras.optimizers.SGD(learning_rate=lr))
    with strategy.scope():
        set_canonical_weights(model, weights)
    if spec.options["data_format"] == "channels_first":
        x = x.transpose(0, 3, 1, 2)
    placement = EagerPlacement()
    placement.start()
    # the benchmark's input path (one global batch in tf.data, split by the distributed
    # iterator), given once: fit stops when it is exhausted, after exactly one step
    with known_limits(spec, strategy):
        model.fit(global_batch_dataset((x, y), repeat=False), epochs=1, verbose=0,
                  shuffle=False, callbacks=[StopPlacement(placement)])
    steps = int(model.optimizer.iterations.numpy())
    if steps != 1:
        raise Invalid(f"the equivalence fit ran {steps} optimizer steps, not 1")
    spec.save_equivalence_output(get_canonical_weights(model))
    return {**compile_info(spec, strategy, devices), **placement.result()}


if __name__ == "__main__":
    main(benchmark, equivalence)
