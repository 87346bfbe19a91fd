"""Data-parallel equivalence (docs/DESIGN.md): one SGD step on global batch B over N devices gives
the same weights as one step on 1 device. Every runner registered with equivalence=True
plugs in here by name; it implements `equivalence(spec)` in its module. A runner's 1-device step
runs once for all its cases whose options cannot change it (tests/helpers/equivalence.py
ONE_DEVICE_UNCHANGED); every case runs its own 2-device step, at the same time as the 1-device
step where that runs too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.catalog.equivalence_coverage import cases_run_here
from bench.catalog.registry import RUNNERS
from bench.run.envs import ensure_env
from tests.helpers.equivalence import RTOL, make_inputs, one_device_options, step, steps_at_once

pytestmark = pytest.mark.slow
# Every runner with its default options, then each option set that changes the reduction or
# the compiled step on CPU (the catalog's equivalence_options; the GPU-only ones are listed in
# docs/EQUIVALENCE.md, bench/catalog/equivalence_coverage.py).
EQUIVALENCE_CASES = [
    pytest.param(name, options, id=name + "".join(f"-{k}={v}" for k, v in options.items()))
    for name, options in cases_run_here()
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe's initial weights and batch (seeded: the same for every case)."""
    path = tmp_path_factory.mktemp("equivalence") / "inputs.npz"
    make_inputs(path)
    return path


@pytest.fixture(scope="module")
def one_device_steps() -> dict:
    """Weights after a runner's 1-device step, by (runner, the options it ran with)."""
    return {}


@pytest.mark.parametrize(("runner", "options"), EQUIVALENCE_CASES)
def test_one_step_on_two_devices_equals_one_device(runner: str, options: dict, tmp_path: Path,
                                                   inputs: Path, one_device_steps: dict
                                                   ) -> None:
    python = str(ensure_env(RUNNERS[runner].family, "cpu").python)
    # the 1-device step at the options that can change it (the runner's defaults for an
    # option of how replicas reduce, shard or place), from an earlier case where it ran
    reference = one_device_options(runner, options)
    key = (runner, tuple(sorted(reference.items())))
    if key in one_device_steps:
        two = step(runner, 2, inputs, tmp_path, python, options)
    else:
        one_device_steps[key], two = steps_at_once(runner, inputs, tmp_path, python,
                                                   (reference, options))
    one = one_device_steps[key]
    with np.load(inputs) as data:
        initial = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    assert set(one) == set(two) == set(initial)
    for name in initial:
        moved = np.abs(one[name] - initial[name]).max()
        assert moved > 1e-3, f"{name} did not move: the step did not happen"
        np.testing.assert_allclose(two[name], one[name], rtol=RTOL, atol=1e-6,
                                   err_msg=f"{runner}: {name} differs between 1 and 2 devices")
