"""kuza55's make_parallel (keras-extras utils/multi_gpu.py, Oct 2016) on Keras 2 (tf_keras in a
TF1 graph), trained by fit as its users trained it (runners/keras/towers.py: stack, input).

Follows the original: for each device i, under `tf.device(device i)` and name scope tower_i,
a Lambda slices the whole input batch (so the whole batch travels to every tower and is cut
there) to rows [i*B//N, (i+1)*B//N) and calls the one template model on it (shared weights and
BatchNorm statistics); the towers' outputs are concatenated on /cpu:0 into the model fit
trains. Compile adds the loss with no device scope (TF's default placement); Keras 2's
gradients colocate each tower's backward ops with its forward ops, and the per-tower
contributions to each shared variable are summed for one SGD update where the variable lives.
At 1 device kuza55 wraps too (one tower, the merge on /cpu:0): so does this runner.
The template is built under the `ps` device (/cpu:0, or the first tower device); the original
leaves that to its user (no scope: TF put the variables on /gpu:0).
Differs: kuza55 silently dropped the B mod N rows left over; this runner refuses such a global
batch (Invalid). Keras 1's merge(mode='concat') is Keras 2's Concatenate.
"""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.keras import towers as kt

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


if __name__ == "__main__":
    main(benchmark, equivalence)
