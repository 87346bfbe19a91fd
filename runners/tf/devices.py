"""The run's TensorFlow devices, without Keras: usable by Keras 3 runners and by legacy-Keras
(tf.compat.v1) runners alike. Child processes only."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from runners.common import Spec, Unavailable


def setup_devices(spec: Spec) -> tuple[list[str], list[dict[str, Any]]]:
    """The run's N devices as TF device names: N virtual CPU devices (device: cpu), or the
    first N GPUs (device: gpu). Call before anything else touches TensorFlow's devices."""
    n = spec.num_devices
    if spec.device == "cpu":
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        names = [f"/cpu:{i}" for i in range(n)]
        return names, [{"name": name, "kind": "virtual CPU device"} for name in names]
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < n:
        raise Unavailable(f"needs {n} GPUs; TensorFlow sees {len(gpus)}")
    for gpu in gpus[:n]:
        tf.config.experimental.set_memory_growth(gpu, True)
    names = [f"/gpu:{i}" for i in range(n)]
    return names, [{"name": name,
                    "kind": tf.config.experimental.get_device_details(gpu).get("device_name")}
                   for name, gpu in zip(names, gpus[:n], strict=True)]
