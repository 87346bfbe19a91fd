"""avolkov1's make_parallel (keras_experiments, keras_exp/multigpu/_multigpu.py and
optimizers.py at 99cd231, Dec 2017) on Keras 2 (tf_keras in a TF1 graph), trained by fit
(runners/tf/towers.py).

For each device i a Lambda under the parameter device (`ps`) cuts rows [i*B//N, (i+1)*B//N)
(the last tower takes the rest), the serial model runs on the slice under tf.device(device i),
and the outputs are concatenated on the parameter device. `input: staging` is its `enqueue`
option made to work (primed one step ahead); `average_gradients` is its SGD_MGPU (N backward
passes of the merged loss, averaged on the first device); `nccl` its usenccl (GPUs only). At 1
device make_parallel returns the serial model: so does this runner unless wrap_single_device.
Differs: the example trains with RMSprop (lr 1e-4 x N); every runner here trains with the same
SGD (momentum 0.9, lr 0.01). docs/runners/keras_tf_avolkov1.md has the sources and reasons.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from contract.result import join
from runners.common import Invalid, Spec, Unavailable, main
from runners.tf import towers as kt
from runners.tf import towers_run

ORIGINAL = "avolkov1's make_parallel (returns the serial model below 2 GPUs)"


def tower_gradients(loss: tf.Tensor, params: list[Any], devices: list[str], nccl: bool
                    ) -> list[list[tf.Tensor]]:
    """avolkov1's OptimizerMultiGPUMixin._get_tower_gradvars + all_avg_gradients
    (optimizers.py 99cd231 lines 172-209 and 36-60): per device the averaged gradients it
    applies. Without NCCL one reduce_mean(stack) on the first device ('/gpu:0', its
    param_server_device default), the same tensors for every device; with NCCL all_sum over
    the devices, each device's output scaled by 1/N on that device."""
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
    """avolkov1's SGD_MGPU (OptimizerMultiGPUMixin + SGD): get_updates applies device 0's
    averaged gradients; with NCCL it goes on over every device (optimizers.py lines 242-261:
    "IMPORTANT when using NCCL to get updates for all devices otherwise the nccl ops
    deadlock"), one SGD update of the shared variables per device under that device's scope.
    Keras 2's SGD.get_updates made new momentum buffers on each call: so does each device's
    update here (its own legacy SGD with the same settings)."""

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
    plain = kt.plain_baseline(spec, devices, input_mode, ORIGINAL)
    if plain is not None:
        return plain[0], join(common, plain[1])
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


def benchmark(spec: Spec) -> dict[str, Any]:
    return towers_run.benchmark(spec, make)


def equivalence(spec: Spec) -> dict[str, Any]:
    return towers_run.equivalence(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence)
