"""kuza55's make_parallel (keras-extras utils/multi_gpu.py, Oct 2016) on Keras 2 (tf_keras in a
TF1 graph), trained by fit as its users trained it (runners/tf/towers.py: stack, input).

Follows the original (utils/multi_gpu.py at 23fb548): for each device i, under
`tf.device('/gpu:%d' % i)` and name scope tower_i (lines 21-22), a Lambda slices the whole
input batch (so the whole batch travels to every tower and is cut there) to rows
[i*B//N, (i+1)*B//N) (get_slice, lines 8-13) and calls the one template model on it (shared
weights and BatchNorm statistics, line 31); the towers' outputs are concatenated on /cpu:0
(lines 40-46) into `Model(input=model.inputs, output=merged)`. Compile adds the loss with no
device scope (TF's default placement); Keras 2's gradients colocate each tower's backward ops
with its forward ops, and the per-tower contributions to each shared variable are summed for
one SGD update where the variable lives. At 1 device kuza55 wraps too (one tower, the merge on
/cpu:0): so does this runner.

Per step each tower device runs one forward and one backward pass of its slice and its own
BatchNorm updates, as Keras 2 ran them: Keras 2's Network.updates took only the updates of the
layer calls the parallel model owns, so the template's own call (on the whole batch, from when
it was built) never ran. tf_keras' training loop fetches every update reachable from the
inputs the parallel model shares with the template, which ran that call (a full-batch forward
pass on the template's device, 38 forward convolutions on CPU:0 against 19 on CPU:1 for
MiniGoogLeNet at 2 devices); towers.Keras2Network restores Keras 2's rule. The record's
forward_convs_per_device / backward_convs_per_device (read from a FULL_TRACE step) show one
tower's convolutions per device, and the parent refuses anything else.

Defaults are the original's usage: `ps: default` builds the template with no device scope.
make_parallel(model, gpu_count) takes the model its user built (line 7); neither the file nor
the README (one line, no example) puts it under a device, and seed 003 (line 67) describes
the parameter server as "defined rather implicitly according to the passed model", so TF put
the variables on /gpu:0. `ps: cpu` (/cpu:0) or `gpu` (the first tower device) are this
harness's options, and a run with either says so (departs_from_original).
Differs: kuza55 silently dropped the B mod N rows left over; this runner refuses such a global
batch (Invalid). Keras 1's merge(mode='concat') is Keras 2's Concatenate.

Mode converge (towers.converge): fit per epoch on the parallel model with the recipe's LR set
per step by a callback, as seed 004 trained. A short kept last batch is sliced as get_slice
slices it, B // N rows per tower and the rest lost (their labels left out of the loss, where
Keras 2's would fail on the shapes): with fewer rows than towers every tower gets none, and
their BatchNorm puts NaN in the moving statistics (seed 002's trap; the record is invalid).
"""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.tf import towers as kt

RUNNER = "keras_tf_kuza55"


def make(spec: Spec, devices: list[str], input_mode: str) -> tuple[kt.Built, dict[str, Any]]:
    template = kt.build_template(spec.model, kt.template_device(spec.options["ps"], devices))
    recipe = kt.Recipe(devices, merge_device="/cpu:0", slice_device=None, remainder="drop")
    built = kt.compile_model(template, recipe, devices[0], input_mode, kt.optimizer(spec))
    return built, {"wrapped": True, "ps": spec.options["ps"],
                   "tower_devices": list(devices), "merge_device": "/cpu:0",
                   "slice_device": "each tower's device (whole batch to every tower)",
                   "split": [spec.global_batch_size // len(devices)] * len(devices)}


def benchmark(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec.global_batch_size, spec.num_devices, RUNNER)
    return kt.benchmark(spec, make)


def equivalence(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec.global_batch_size, spec.num_devices, RUNNER)
    return kt.equivalence(spec, make)


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: kt.converge (fit per epoch on the tower model, LR per step by callback).
    The global batch divides (per-device batch x towers); a short kept last batch is sliced as
    kuza55 sliced it, its remainder rows lost (their labels too: kt.converge_loss)."""
    kt.require_even_split(spec.global_batch_size, spec.num_devices, RUNNER)
    return kt.converge(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
