"""avolkov1's make_parallel (keras_experiments at 99cd231) on Keras 2, trained by fit
(runners/tf/towers.py): per device a Lambda slices the rows, the serial model runs under
tf.device, outputs concatenated on the parameter device; its SGD_MGPU and usenccl as options.
Differs: every runner here trains with the same SGD (the example: RMSprop).
docs/runners/keras_tf_avolkov1.md, "Notes from the code"."""

from __future__ import annotations

from functools import partial
from typing import Any

import tensorflow as tf
import tf_keras

from runners.common import Invalid, Spec, Unavailable, main
from runners.tf import towers as kt
from runners.tf import towers_run

ORIGINAL = "avolkov1's make_parallel (returns the serial model below 2 GPUs)"


def tower_gradients(loss: tf.Tensor, params: list[Any], devices: list[str], nccl: bool
                    ) -> list[list[tf.Tensor]]:
    """avolkov1's _get_tower_gradvars + all_avg_gradients: per device the averaged gradients it
    applies (reduce_mean on the first device, or NCCL all_sum scaled by 1/N)."""
    copies = []
    for i, dev in enumerate(devices):
        with tf.device(dev), tf.name_scope(f"tower_{i}"):
            copies.append(tf.compat.v1.gradients(loss, params,
                                                 colocate_gradients_with_ops=not nccl))
    if not nccl:
        with tf.device(devices[0]):
            averaged = [tf.reduce_mean(tf.stack(list(g)), 0) for g in zip(*copies, strict=True)]
        return [averaged] * len(devices)
    from tensorflow.python.ops import nccl_ops

    per_device: list[list[tf.Tensor]] = [[] for _ in devices]
    for grads in zip(*copies, strict=True):
        summed = nccl_ops.all_sum(list(grads))
        for i, (dev, g) in enumerate(zip(devices, summed, strict=True)):
            with tf.device(dev):
                per_device[i].append(g * (1.0 / len(devices)))
    return per_device


class SGDMultiGPU(kt.Keras2SGD):
    """avolkov1's SGD_MGPU: applies device 0's averaged gradients; with NCCL one SGD update per
    device under its scope, each device's update with its own legacy SGD, as Keras 2 did."""

    def __init__(self, *, devices: list[str], nccl: bool, learning_rate: float,
                 momentum: float = 0.0) -> None:
        super().__init__(learning_rate=learning_rate, momentum=momentum)
        self._devices, self._nccl = list(devices), nccl
        self._settings = {"learning_rate": learning_rate, "momentum": momentum}

    def get_updates(self, loss: tf.Tensor, params: list[Any]) -> list[Any]:
        per_device = tower_gradients(loss, params, self._devices, self._nccl)
        updates = [self.apply_gradients(list(zip(per_device[0], params, strict=True)))]
        if not self._nccl:
            return updates
        for i, dev in enumerate(self._devices[1:], start=1):
            with tf.device(dev), tf.name_scope(f"tower_{i}"):
                # its settings as given, not get_config (which would run the session, and a
                # graph holding NCCL ops cannot start a session without GPUs)
                other = tf_keras.optimizers.legacy.SGD(**self._settings, name=f"SGD_tower_{i}")
                updates.append(other.apply_gradients(list(zip(per_device[i], params,
                                                              strict=True))))
        return updates


def make(spec: Spec, devices: list[str], input_mode: str) -> tuple[kt.Built, dict[str, Any]]:
    opts = spec.options
    average, nccl = bool(opts["average_gradients"]), bool(opts["nccl"])
    if nccl and not average:
        raise Invalid("nccl averages the multi-GPU optimizer's gradients: set "
                      "average_gradients: true")
    if nccl and spec.device != "gpu":
        raise Unavailable("NCCL all-reduce runs on GPUs only")
    common = {"ps": opts["ps"], "template_device": opts["template_device"],
              "average_gradients": average, "nccl": nccl}
    plain = kt.plain_baseline(spec, devices, input_mode, ORIGINAL, common)
    if plain is not None:
        return plain
    ps = "/cpu:0" if opts["ps"] == "cpu" else devices[0]
    template = kt.build_template(spec.model, kt.template_device(opts["template_device"],
                                                                devices))
    recipe = kt.Recipe(devices, merge_device=ps, slice_device=ps, remainder="last")
    built = kt.compile_model(template, recipe, devices[0], input_mode,
                             kt.optimizer(spec, SGDMultiGPU, devices=devices, nccl=nccl)
                             if average else kt.optimizer(spec))
    n = len(devices)
    return built, {**common, "wrapped": True, "tower_devices": list(devices),
                   "merge_device": ps, "slice_device": ps,
                   "gradient_copies": n if average else 1,
                   "split": kt.split_rows(spec.global_batch_size, n, "last")}


benchmark = partial(towers_run.benchmark, make=make)
equivalence = partial(towers_run.equivalence, make=make)


if __name__ == "__main__":
    main(benchmark, equivalence)
