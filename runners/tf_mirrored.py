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
(runners/tf_data.py), "keras" the Keras 3 PyDataset over the JPEG files (runners/keras_data.py,
worker processes); either gives global batches that the distributed iterator splits.
"""

from __future__ import annotations

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
from runners.common import Spec, load_equivalence_inputs, main, save_equivalence_output
from runners.tf_common import (
    POLICIES,
    fit_input,
    framework_versions,
    setup_devices,
    timed_fit,
)

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
    names, devices = setup_devices(spec)
    cross = CROSS_DEVICE_OPS[spec["options"].get("cross_device_ops", "auto")]
    strategy = tf.distribute.MirroredStrategy(devices=names,
                                              cross_device_ops=cross() if cross else None)
    return strategy, devices


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec["options"]
    keras.mixed_precision.set_global_policy(POLICIES[spec["precision"]])
    strategy, devices = make_strategy(spec)
    model_spec = get_spec(spec["model"])
    data_format = opts.get("data_format", "channels_last")
    per_call = opts.get("steps_per_execution", 1)
    with strategy.scope():
        model = load_builder(spec["model"], "keras")(model_spec, data_format=data_format)
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
            steps_per_execution=per_call,
            jit_compile=bool(opts.get("xla", False)),
        )
    data, data_info = fit_input(spec, model_spec, data_format,
                                spec["warmup_steps"] + spec["measure_steps"])
    return {
        **timed_fit(spec, model, data, per_call),
        "replicas": strategy.num_replicas_in_sync,
        "framework": framework_versions(),
        "devices": devices,
        "layout": data_format,
        "dtype_policy": POLICIES[spec["precision"]],
        "xla": bool(opts.get("xla", False)),
        "cross_device_ops": type(strategy.extended._cross_device_ops).__name__
        if getattr(strategy.extended, "_cross_device_ops", None) else "default",
        "data_placement": DATA_PLACEMENT[spec["data"]],
        **data_info,
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
