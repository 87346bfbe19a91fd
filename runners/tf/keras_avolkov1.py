"""avolkov1's make_parallel (keras_experiments, keras_exp/multigpu/_multigpu.py and
optimizers.py as of Dec 2017) on Keras 2 (tf_keras in a TF1 graph), trained by fit
(runners/keras/towers.py: stack, input).

Follows the original: the serial model is built under the parameter device (`ps`: /cpu:0 as
its docs show, or the first device); for each device i a Lambda under the parameter device
cuts rows [i*B//N, (i+1)*B//N) of the batch (the last tower takes the rest), the one serial
model is called on the slice under `tf.device(device i)` and name scope tower_i, and the
outputs are concatenated on the parameter device. One loss over the merged output.
`input: staging` is its `enqueue` option made to work: each slice is put into a StagingArea on
its tower's device and the tower reads the put of the step before (the original put and got in
the same step and warned that it did not work; runners/keras/towers.py primes the areas).
`average_gradients` is its multi-GPU optimizer (SGD_MGPU, `syncopt`): for every device, under
`tf.device(device)` and name scope tower_i, tf.gradients of the MERGED loss (colocated with
the forward ops), i.e. N full backward passes over all towers, then the N copies averaged
with reduce_mean(stack) on the first device (all_avg_gradients' default '/gpu:0') and applied
once. The graph holds the N copies ("conv_backprop_filter_ops_built"), but TF's
common-subexpression elimination merges the identical copies before it runs the step
("conv_backprop_filter_ops", read from the partition graphs): with colocated gradients the
N-fold backward work is not executed. `nccl` (GPUs only, with average_gradients) is its
usenccl: the copies are computed without colocation under each device's scope, summed by NCCL
all-reduce and scaled by 1/N on each device.
At 1 device make_parallel returns the serial model: this runner trains the plain model on that
device (`wrapped: false`); `wrap_single_device: true` builds the one-tower wrapper instead.
Differs: with usenccl the original also builds one optimizer update per device on the shared
variables (N updates of each variable per step); this runner applies the first device's
averaged gradients once. tf.contrib.nccl is TF's nccl_ops.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from runners.common import Invalid, Spec, Unavailable, main
from runners.keras import towers as kt

ORIGINAL = "avolkov1's make_parallel (returns the serial model below 2 GPUs)"


def merged_loss_gradients(devices: list[str], nccl: bool) -> kt.GradientsFn:
    """avolkov1's OptimizerMultiGPUMixin._get_tower_gradvars + all_avg_gradients."""
    def gradients(loss: tf.Tensor, params: list[Any]) -> list[tf.Tensor]:
        copies = []
        for i, dev in enumerate(devices):
            with tf.device(dev), tf.name_scope(f"tower_{i}"):
                copies.append(tf.compat.v1.gradients(loss, params,
                                                     colocate_gradients_with_ops=not nccl))
        if nccl:
            from tensorflow.python.ops import nccl_ops

            averaged = []
            for per_device in zip(*copies, strict=True):
                summed = nccl_ops.all_sum(list(per_device))
                scaled = []
                for dev, g in zip(devices, summed, strict=True):
                    with tf.device(dev):
                        scaled.append(g * (1.0 / len(devices)))
                averaged.append(scaled[0])
            return averaged
        with tf.device(devices[0]):
            return [tf.reduce_mean(tf.stack(list(g)), 0) for g in zip(*copies, strict=True)]
    return gradients


def make(spec: Spec, devices: list[str], input_mode: str) -> tuple[kt.Built, dict[str, Any]]:
    opts = spec.options
    average, nccl = bool(opts["average_gradients"]), bool(opts["nccl"])
    if nccl and not average:
        raise Invalid("nccl averages the multi-GPU optimizer's gradients: set "
                      "average_gradients: true")
    if nccl and spec.device != "gpu":
        raise Unavailable("NCCL all-reduce runs on GPUs only")
    common = {"ps": opts["ps"], "average_gradients": average, "nccl": nccl}
    plain = kt.single_device(spec, devices, ORIGINAL)
    if plain is not None:
        template = kt.build_template(spec.model, devices[0])
        built = kt.compile_model(template, None, devices[0], input_mode, kt.optimizer(spec))
        return built, {**common, **plain}
    ps = kt.ps_device(spec, devices)
    template = kt.build_template(spec.model, ps)
    recipe = kt.Recipe(devices, merge_device=ps, slice_device=ps, remainder="last")
    grads = merged_loss_gradients(devices, nccl) if average else kt.keras2_gradients
    built = kt.compile_model(template, recipe, devices[0], input_mode,
                             kt.optimizer(spec, grads))
    b, n = spec.global_batch_size, len(devices)
    return built, {**common, "wrapped": True, "tower_devices": list(devices),
                   "merge_device": ps, "slice_device": ps,
                   "gradient_copies": n if average else 1,
                   "split": [b // n] * (n - 1) + [b - (n - 1) * (b // n)]}


def benchmark(spec: Spec) -> dict[str, Any]:
    return kt.benchmark(spec, make)


def equivalence(spec: Spec) -> dict[str, Any]:
    return kt.equivalence(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence)
