"""Keras 2.0.9-2.2.x `keras.utils.multi_gpu_model` rebuilt on Keras 3 + TF.

Split: every replica slices its part of the global batch on its own device; each gets B//N
rows and the last one also takes the remainder (B - (N-1)*(B//N)), as Keras 2.1+ did.
Variables: the template is built under /cpu:0 (what the Keras docs told users to do); with
`cpu_relocation` the template is built without a device scope and then rebuilt under /cpu:0
with its weights copied in (clone_model + set_weights), as Keras 2.2.1's option did.
Merge: replica outputs are concatenated on the CPU (`cpu_merge`, default) or on the first
device; one loss over the merged output; gradients via tf.gradients, colocated with each
replica's forward ops, summed per shared variable and applied once where the variable lives.
The template (not the wrapper) stays saveable (seed 002, tip 4): once per run it is saved to
a .keras file, reloaded and its weights compared ("saved_template_ok").
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from runners import keras_towers as kt
from runners.common import Spec, main


def make(spec: Spec, devices: list[str]) -> tuple[kt.TowerModel, keras.Model]:
    """The parallel model and the template it trains."""
    opts = spec["options"]
    if opts.get("cpu_relocation", False):
        built = kt.build_template(spec["model"], None)
        with tf.device("/cpu:0"):
            template = keras.models.clone_model(built)
        template.set_weights(built.get_weights())
    else:
        template = kt.build_template(spec["model"], "/cpu:0")
    merge = "/cpu:0" if opts.get("cpu_merge", True) else devices[0]
    return kt.TowerModel(template, devices, merge_device=merge, remainder="last"), template


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec["options"]
    return kt.benchmark_towers(spec, make, {
        "cpu_merge": bool(opts.get("cpu_merge", True)),
        "cpu_relocation": bool(opts.get("cpu_relocation", False)),
        "split": kt.split_sizes(spec["global_batch_size"], spec["num_devices"], "last"),
    }, after=lambda template: {"saved_template_ok": kt.check_saveable(template)})


def equivalence(spec: Spec) -> dict[str, Any]:
    return kt.equivalence_towers(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence)
