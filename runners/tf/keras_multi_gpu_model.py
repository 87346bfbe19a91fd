"""Keras 2's keras.utils.multi_gpu_model (2.1.6 .. 2.2.5) on Keras 2, trained by fit
(runners/tf/towers.py): per device a Lambda takes its rows and calls the template, outputs
merged on /cpu:0 or the first device; keras_version, cpu_relocation and template_device as
options. Differs: at 1 device the plain model is trained unless wrap_single_device.
docs/runners/keras_tf_multi_gpu_model.md, "Notes from the code"."""

from __future__ import annotations

import os
import tempfile
from functools import partial
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from runners.common import Invalid, Spec, main
from runners.tf import towers as kt
from runners.tf import towers_run

ORIGINAL = "Keras 2.2 multi_gpu_model (refuses gpus < 2)"
SLICING = {"2.1": None, "2.2": "input"}


def make(spec: Spec, devices: list[str], input_mode: str) -> tuple[kt.Built, dict[str, Any]]:
    opts = spec.options
    version = str(opts["keras_version"])  # the catalog's choices: SLICING's keys
    common = {"keras_version": version, "cpu_merge": bool(opts["cpu_merge"]),
              "cpu_relocation": bool(opts["cpu_relocation"])}
    plain = kt.plain_baseline(spec, devices, input_mode, ORIGINAL, common)
    if plain is not None:
        return plain
    where = str(opts["template_device"])
    if where == "docs":  # the docstring's example for these arguments
        where = "cpu" if common["cpu_merge"] and not common["cpu_relocation"] else "default"
    common["template_built_on"] = where
    passed = kt.build_template(spec.model, kt.template_device(where, devices))
    template = passed
    if common["cpu_relocation"]:
        with tf.device("/cpu:0"):
            template = tf_keras.models.clone_model(passed)
    merge = "/cpu:0" if common["cpu_merge"] else devices[0]
    recipe = kt.Recipe(devices, merge_device=merge, slice_device=SLICING[version],
                       remainder="last", scope="replica")
    built = kt.compile_model(template, recipe, devices[0], input_mode, kt.optimizer(spec))
    return built, {
        **common, "wrapped": True, "tower_devices": list(devices), "merge_device": merge,
        "slice_device": (f"the input's device ({template.inputs[0].device or 'none'})"
                         if version == "2.2" else "each replica's device (whole batch to "
                                                  "every replica)"),
        "split": kt.split_rows(spec.global_batch_size, len(devices), "last")}


def saved_template(built: kt.Built) -> dict[str, Any]:
    """saved_template_ok: the trained template saved to HDF5 and loaded back; Invalid unless
    every weight matches."""
    template = built.template
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
    return {"saved_template_ok": True}


benchmark = partial(towers_run.benchmark, make=make, after=saved_template)
equivalence = partial(towers_run.equivalence, make=make)
# converge: the trained template saved and reloaded after; a short kept last batch is sliced
# as get_slice slices it (the last replica takes the remainder)
converge = partial(towers_run.converge, make=make, after=saved_template)


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
