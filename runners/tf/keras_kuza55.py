"""kuza55's make_parallel (keras-extras at 23fb548) on Keras 2, trained by fit
(runners/tf/towers.py): per device a Lambda slices the batch and calls the template, outputs
concatenated on /cpu:0. Differs: a global batch not divisible by N is refused (Invalid) where
kuza55 dropped the rest. docs/runners/keras_tf_kuza55.md, "Notes from the code"."""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.tf import towers as kt
from runners.tf import towers_run

RUNNER = "keras_tf_kuza55"


def make(spec: Spec, devices: list[str], input_mode: str) -> tuple[kt.Built, dict[str, Any]]:
    template = kt.build_template(spec.model, kt.template_device(spec.options["ps"], devices))
    recipe = kt.Recipe(devices, merge_device="/cpu:0", slice_device=None, remainder="drop")
    built = kt.compile_model(template, recipe, devices[0], input_mode, kt.optimizer(spec))
    return built, {"wrapped": True, "ps": spec.options["ps"],
                   "tower_devices": list(devices), "merge_device": "/cpu:0",
                   "slice_device": "each tower's device (whole batch to every tower)",
                   "split": kt.split_rows(spec.global_batch_size, len(devices), "drop")}


def benchmark(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec.global_batch_size, spec.num_devices, RUNNER)
    return towers_run.benchmark(spec, make)


def equivalence(spec: Spec) -> dict[str, Any]:
    kt.require_even_split(spec.global_batch_size, spec.num_devices, RUNNER)
    return towers_run.equivalence(spec, make)


def converge(spec: Spec) -> dict[str, Any]:
    """towers_run.converge; a short kept last batch is sliced as kuza55 sliced it, its
    remainder rows lost (their labels too: towers_run.converge_loss)."""
    kt.require_even_split(spec.global_batch_size, spec.num_devices, RUNNER)
    return towers_run.converge(spec, make)


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
