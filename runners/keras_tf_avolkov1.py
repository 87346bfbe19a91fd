"""avolkov1's make_parallel (keras_experiments, 2017) rebuilt on Keras 3 + TF.

Split: the global batch is sliced on the parameter device (`ps`: /cpu:0, or the first
device), B/N rows per tower, and only each slice travels to its tower. With `prefetch`, each
slice is copied onto its tower's device by an explicit tf.identity under that device's scope
ahead of the tower's first op: the modern stand-in for avolkov1's StagingArea (seed 003), a
distinct copy op the runtime can start as soon as the slice exists, before the tower runs.
Variables: one template model built on the parameter device, shared by every tower.
Merge: outputs are concatenated on the parameter device and one loss is computed there, the
gradients colocated with each tower's ops (tf.gradients); or, with `average_gradients`, each
tower computes its own mean loss and gradients on its device (GradientTape under the tower's
scope, in an overridden train_step) and the per-tower gradients are averaged on the parameter
device before one update. With equal slices both give the global-mean gradient. Like kuza55,
avolkov1 gave each tower B//N rows; a global batch not divisible by N is refused (Invalid).
"""

from __future__ import annotations

from typing import Any

import keras

from runners import keras_towers as kt
from runners.common import Spec, main

RUNNER = "keras_tf_avolkov1"


def make(spec: Spec, devices: list[str]) -> tuple[kt.TowerModel, keras.Model]:
    """The parallel model and its template, variables and slicing on the parameter device."""
    opts = spec["options"]
    ps = kt.ps_device(spec, devices)
    template = kt.build_template(spec["model"], ps)
    model = kt.TowerModel(template, devices, merge_device=ps, slice_device=ps,
                          remainder="drop", prefetch=bool(opts.get("prefetch", False)),
                          average_gradients=bool(opts.get("average_gradients", False)))
    return model, template


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec["options"]
    kt.require_even_split(spec["global_batch_size"], spec["num_devices"], RUNNER)
    return kt.benchmark_towers(spec, make, {
        "ps": opts.get("ps", "cpu"),
        "prefetch": bool(opts.get("prefetch", False)),
        "average_gradients": bool(opts.get("average_gradients", False)),
    })


def equivalence(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec["global_batch_size"], spec["num_devices"], RUNNER)
    return kt.equivalence_towers(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence)
