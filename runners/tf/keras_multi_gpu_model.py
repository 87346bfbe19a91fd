"""Keras 2's `keras.utils.multi_gpu_model` (keras-team/keras 2.1.6 .. 2.2.5,
keras/utils/multi_gpu_utils.py) on Keras 2 (tf_keras in a TF1 graph), trained by fit
(runners/tf/towers.py: stack, input).

Follows the original: for each device i, under `tf.device(device i)` and name scope
replica_i, a Lambda takes rows [i*B//N, (i+1)*B//N) of the input batch, the last replica also
taking the remainder (get_slice), and the template is called on them; outputs are concatenated
on /cpu:0 (`cpu_merge: true`) or on the first device (`cpu_merge: false`) into
`Model(model.inputs, merged)`.
`keras_version` picks the slicing: "2.1" (2.0.9 .. 2.1.6) slices inside each replica's device
scope, so the whole batch travels to every device; "2.2" (2.2.0+, keras PR #10230) slices
under `tf.device(x.device)`, the device of the template's input placeholder, so only each
slice travels. `cpu_relocation` (from 2.1.6 on, both versions) clones the template under
/cpu:0 (clone_model: new variables, freshly initialised) and trains the clone, as the original
does; the model passed in is then not the one trained.

Per step each replica's device runs one forward and one backward pass of its slice and its
own BatchNorm updates, as Keras 2 ran them (Network.updates: only the layer calls the parallel
model owns); tf_keras' training loop would also run the template's own call on the whole batch
(towers.Keras2Network restores Keras 2's rule; kuza55's docstring has the counts). The record's
forward_convs_per_device / backward_convs_per_device, from a FULL_TRACE step, show it and the
parent checks them.

Defaults are the original's usage, its docstring's examples (2.2.4, "# Examples"): Example 1,
the default arguments, builds the template under `with tf.device('/cpu:0')` ("We recommend
doing this with under a CPU device scope"), as seed 004 did for MiniGoogLeNet (its text's
line 118: "on Line 84 ... use the CPU"); Examples 2 (cpu_relocation=True) and 3
(cpu_merge=False, "recommended for NV-link") build it with no device scope ("Not needed to
change the device scope for model definition").
`template_device: docs` follows the example that matches the arguments; `cpu`, `default` (no
scope) or `gpu` (the first device) are this harness's options, and a run with one says so
(departs_from_original), as does any other option changed from its default.
At 1 device the original refuses (gpus must be >= 2; Examples 2 and 3 then train the plain
model): this runner trains the plain template on that device and says so (`wrapped: false`);
`wrap_single_device: true` builds the one-replica wrapper instead, to measure its own cost.
Differs: Keras 2.0.9-2.1.5 had no cpu_merge / cpu_relocation arguments (merge on /cpu:0
always); "2.1" here is 2.1.6's code. The template, not the wrapper, is saved once per run
(HDF5, Keras 2's format) and reloaded ("saved_template_ok", seed 002 tip 4).

Mode converge (towers.converge): fit per epoch on the replica model with the recipe's LR set
per step by a callback, as seed 004 trained its MiniGoogLeNet with multi_gpu_model (its
poly_decay a LearningRateScheduler). A short kept last batch is sliced as get_slice slices it:
B // N rows to each replica, the remainder to the last; with fewer rows than replicas the first
get none, and their BatchNorm puts NaN in the shared moving statistics (seed 002's trap; the
record is invalid). The trained template is saved and reloaded after, as in the benchmark.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from runners.common import Invalid, Spec, main
from runners.tf import towers as kt

ORIGINAL = "Keras 2.2 multi_gpu_model (refuses gpus < 2)"
SLICING = {"2.1": None, "2.2": "input"}


def make(spec: Spec, devices: list[str], input_mode: str) -> tuple[kt.Built, dict[str, Any]]:
    opts = spec.options
    version = str(opts["keras_version"])
    if version not in SLICING:
        raise Invalid(f"keras_version {version!r} is not one of {sorted(SLICING)}")
    common = {"keras_version": version, "cpu_merge": bool(opts["cpu_merge"]),
              "cpu_relocation": bool(opts["cpu_relocation"])}
    plain = kt.single_device(spec, devices, ORIGINAL)
    if plain is not None:
        template = kt.build_template(spec.model, devices[0])
        built = kt.compile_model(template, None, devices[0], input_mode, kt.optimizer(spec))
        return built, {**common, **plain}
    where = str(opts["template_device"])
    if where == "docs":  # the docstring's example for these arguments
        where = "cpu" if common["cpu_merge"] and not common["cpu_relocation"] else "default"
    common["template_built_on"] = where
    passed = kt.build_template(spec.model, kt.template_device(where, devices))
    template = passed
    if common["cpu_relocation"]:
        import tensorflow as tf
        import tf_keras

        with tf.device("/cpu:0"):
            template = tf_keras.models.clone_model(passed)
    merge = "/cpu:0" if common["cpu_merge"] else devices[0]
    recipe = kt.Recipe(devices, merge_device=merge, slice_device=SLICING[version],
                       remainder="last", scope="replica")
    built = kt.compile_model(template, recipe, devices[0], input_mode, kt.optimizer(spec))
    b, n = spec.global_batch_size, len(devices)
    return built, {
        **common, "wrapped": True, "tower_devices": list(devices), "merge_device": merge,
        "slice_device": (f"the input's device ({template.inputs[0].device or 'none'})"
                         if version == "2.2" else "each replica's device (whole batch to "
                                                  "every replica)"),
        "split": [b // n] * (n - 1) + [b - (n - 1) * (b // n)]}


def check_saveable(template: Any) -> bool:
    """Save the template to HDF5, load it back, and check every weight matches; Invalid if
    not."""
    import tf_keras

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "template.h5")
        template.save(path)
        loaded = tf_keras.models.load_model(path, compile=False)
        ours, theirs = template.get_weights(), loaded.get_weights()
    # equal_nan: a run whose BatchNorm statistics went NaN (seed 002's trap) saves them too
    if len(ours) != len(theirs) or not all(
            a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
            for a, b in zip(ours, theirs, strict=True)):
        raise Invalid("the saved and reloaded template's weights differ from the template's")
    return True


def _with_saved_template(run: Any, spec: Spec) -> dict[str, Any]:
    """run(spec, make) with the trained template saved and reloaded after (saved_template_ok)."""
    holder: dict[str, Any] = {}

    def make_and_keep(spec: Spec, devices: list[str], input_mode: str
                      ) -> tuple[kt.Built, dict[str, Any]]:
        built, fields = make(spec, devices, input_mode)
        holder["template"] = built.template
        return built, fields

    result = run(spec, make_and_keep)
    return {**result, "saved_template_ok": check_saveable(holder["template"])}


def benchmark(spec: Spec) -> dict[str, Any]:
    return _with_saved_template(kt.benchmark, spec)


def equivalence(spec: Spec) -> dict[str, Any]:
    return kt.equivalence(spec, make)


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: kt.converge (fit per epoch on the replica model, LR per step by
    callback); a short kept last batch is sliced as get_slice slices it (the last replica
    takes the remainder, the others B // N rows, possibly none)."""
    return _with_saved_template(kt.converge, spec)


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
