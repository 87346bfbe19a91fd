"""Data-parallel equivalence (docs/DESIGN.md): one SGD step on global batch B over N devices gives
the same weights as one step on 1 device. Every runner registered with equivalence=True
plugs in here by name; it implements `equivalence(spec)` in its module."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.catalog.equivalence_coverage import cases_run_here
from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.run.envs import ensure_env
from bench.run.launch import launch
from models import get_spec
from tests.specs import run_spec

pytestmark = pytest.mark.slow
# Every runner with its default options, then each option set that changes the reduction or
# the compiled step on CPU (the catalog's equivalence_options; the GPU-only ones are listed in
# docs/EQUIVALENCE.md, bench/catalog/equivalence_coverage.py).
EQUIVALENCE_CASES = [
    pytest.param(name, options, id=name + "".join(f"-{k}={v}" for k, v in options.items()))
    for name, options in cases_run_here()
]
BATCH, LR, RTOL = 16, 0.5, 1e-5


def make_inputs(path: Path) -> None:
    """Initial weights (canonical names and layouts from the probe spec) and one batch."""
    rng = np.random.default_rng(1234)
    weights = {f"w:{name}": (rng.standard_normal(shape) * 0.3).astype(np.float32)
               for name, shape in get_spec("probe").weights}
    h, w, c = get_spec("probe").input_shape
    x = rng.standard_normal((BATCH, h, w, c)).astype(np.float32)
    y = rng.integers(0, get_spec("probe").num_classes, BATCH).astype(np.int32)
    np.savez(path, x=x, y=y, **weights)


def load_weights(path: Path) -> dict[str, np.ndarray]:
    """The weights of an inputs or output .npz, under their canonical names."""
    with np.load(path) as data:
        return {k[2:]: data[k] for k in data.files if k.startswith("w:")}


def equivalence_spec(runner: str, family: str, module: str, num_nodes: int, inputs: Path,
                     out: Path) -> RunSpec:
    """The equivalence step of `runner` on one device per node (the multi-node tests)."""
    return run_spec(runner=runner, family=family, module=module, model="probe",
                    num_nodes=num_nodes, num_devices=num_nodes, scaling="strong",
                    global_batch_size=BATCH, batch_size_per_device=BATCH // num_nodes,
                    warmup_steps=0, measure_steps=1, mode="equivalence",
                    equivalence={"inputs": str(inputs), "output": str(out),
                                 "learning_rate": LR})


def step(runner: str, n: int, inputs: Path, tmp_path: Path, python: str,
         options: dict | None = None) -> dict:
    """Weights after one step of `runner` on n devices (its default options, then `options`)."""
    info = RUNNERS[runner]
    out = tmp_path / f"{runner}-n{n}.npz"
    spec = RunSpec(
        run_id=f"eq-{runner}-n{n}", sweep_id="eq", runner=runner, family=info.family,
        module=info.module, model="probe", num_devices=n, device="cpu", virtual_devices=True,
        scaling="strong", batch_size_per_device=BATCH // n, global_batch_size=BATCH,
        data="synthetic", precision="fp32", warmup_steps=0, measure_steps=1, repeat=0,
        timeout_s=300,
        options={**{name: opt.default for name, opt in info.options.items()}, **(options or {})},
        mode="equivalence", launcher=info.launcher,
        equivalence={"inputs": str(inputs), "output": str(out), "learning_rate": LR})
    rec = launch(spec, python, tmp_path, {})
    assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
    # where the step ran, as the framework reports it (the parent already refused a
    # multi-device run whose placement does not cover its devices)
    placement = rec["placement"]
    assert placement and all(v > 0 for v in placement.values()), placement
    if n > 1 and not rec["result"].get("placement_collapsed"):
        assert len(placement) >= n, placement
    with np.load(out) as data:
        return {k[2:]: data[k] for k in data.files}


@pytest.mark.parametrize(("runner", "options"), EQUIVALENCE_CASES)
def test_one_step_on_two_devices_equals_one_device(runner: str, options: dict,
                                                   tmp_path: Path) -> None:
    python = str(ensure_env(RUNNERS[runner].family, "cpu").python)
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    one = step(runner, 1, inputs, tmp_path, python, options)
    two = step(runner, 2, inputs, tmp_path, python, options)
    with np.load(inputs) as data:
        initial = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    assert set(one) == set(two) == set(initial)
    for name in initial:
        moved = np.abs(one[name] - initial[name]).max()
        assert moved > 1e-3, f"{name} did not move: the step did not happen"
        np.testing.assert_allclose(two[name], one[name], rtol=RTOL, atol=1e-6,
                                   err_msg=f"{runner}: {name} differs between 1 and 2 devices")
