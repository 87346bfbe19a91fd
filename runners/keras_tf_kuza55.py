"""kuza55's make_parallel (Oct 2016, keras-extras utils/multi_gpu.py) rebuilt on Keras 3 + TF.

Split: the whole global batch goes to every tower's device and each tower slices its own
B/N rows there (x[i*B/N:(i+1)*B/N]), as kuza55's get_slice did inside the device scope.
Variables: one template model built on the parameter device (`ps`: /cpu:0, or the first
device); every tower calls that same template, so weights and BatchNorm statistics are shared.
Merge: tower outputs are concatenated on the parameter device, where one loss is computed
over the merged output; gradients are taken with tf.gradients, which colocates each tower's
backward ops with its forward ops (colocate_gradients_with_ops=True), and the per-tower
contributions to each shared variable are summed for a single update on the parameter device.
kuza55 gave each tower B//N rows and silently dropped the rest: this runner refuses (Invalid)
a global batch that does not divide by N instead.
"""

from __future__ import annotations

from typing import Any

import keras

from runners import keras_towers as kt
from runners.common import Spec, main

RUNNER = "keras_tf_kuza55"


def make(spec: Spec, devices: list[str]) -> tuple[kt.TowerModel, keras.Model]:
    """The parallel model and its template, variables on the parameter device."""
    ps = kt.ps_device(spec, devices)
    template = kt.build_template(spec["model"], ps)
    return kt.TowerModel(template, devices, merge_device=ps, remainder="drop"), template


def benchmark(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec["global_batch_size"], spec["num_devices"], RUNNER)
    return kt.benchmark_towers(spec, make, {"ps": spec["options"].get("ps", "cpu")})


def equivalence(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec["global_batch_size"], spec["num_devices"], RUNNER)
    return kt.equivalence_towers(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence)
