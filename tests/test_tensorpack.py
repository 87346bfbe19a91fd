"""tensorpack beyond the generic TF-runner and equivalence tests: the parameter-server trainer
and the plain queue input at 2 devices, towers on 2 distinct devices that TensorFlow reports
running the step (placement), parameter counts equal to the spec, and tensorpack's own choice at
8 towers (hierarchical all-reduce, with its GradientPacker where the gradients are big enough):
one step equal to one device's on the probe, and equal to the unpacked all-reduce on
MiniGoogLeNet. The registry defaults (replicated, staging input) at 1 and 2 devices:
test_tf_runners.py, on the runs of its sweep."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.records.store import check_record
from bench.run.launch import launch
from tests.helpers.cli import run_child
from tests.helpers.equivalence import BATCH, LR, RTOL, make_inputs
from tests.helpers.sweeps import smoke_sweep
from tests.helpers.tensorpack import check_towers, short

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]


def test_parameter_server_with_queue_input(tmp_path: Path, tf_python: str) -> None:
    """At 2 devices, where the parameter server (/cpu:0) is not the second tower's device (at 1
    device both are CPU:0; tensorpack's 1-device run: test_tf_runners.py)."""
    records = smoke_sweep(tmp_path / "out", "runners=[tensorpack]", "devices=[2]",
                          "runner_options.tensorpack.trainer=parameter_server",
                          "runner_options.tensorpack.input=queue")
    assert sorted(records) == [2]
    for n, rec in records.items():
        assert check_record(rec) == []
        assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
        assert rec["samples"] == 3 * 8 * n
        result = rec["result"]
        assert result["trainer"] == "SyncMultiGPUTrainerParameterServer"
        assert result["input"] == "QueueInput"
        assert result["ps_device"] == "cpu"
        assert short(result["variable_devices"]) == {"CPU:0"}  # one shared copy, on /cpu:0
        check_towers(result, n)


def equivalence_step(n: int, options: dict, inputs: Path, tmp_path: Path,
                     python: str) -> tuple[dict[str, np.ndarray], dict]:
    """The weights after the equivalence step on n devices, and its record."""
    info = RUNNERS["tensorpack"]
    out = tmp_path / f"tp-{n}-{'-'.join(map(str, options.values()))}.npz"
    spec = RunSpec(
        run_id=f"eq-tensorpack-n{n}", sweep_id="eq", runner="tensorpack", family=info.family,
        module=info.module, model="probe", num_devices=n, device="cpu", virtual_devices=True,
        scaling="strong", batch_size_per_device=BATCH // n, global_batch_size=BATCH,
        data="synthetic", precision="fp32", warmup_steps=0, measure_steps=1, repeat=0,
        timeout_s=300, options={**{k: o.default for k, o in info.options.items()}, **options},
        mode="equivalence",
        equivalence={"inputs": str(inputs), "output": str(out), "learning_rate": LR})
    rec = launch(spec, python, tmp_path, {})
    assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
    with np.load(out) as data:
        return {k[2:]: data[k] for k in data.files}, rec


def test_eight_towers_hierarchical_equals_one_device(tmp_path: Path, tf_python: str) -> None:
    """At 8 towers tensorpack 0.11 picks its hierarchical all-reduce (DGX-1's two groups of 4);
    it runs on 8 virtual CPU devices too. The probe is too small for the GradientPacker (under
    1024 elements per split), which the record says."""
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    one, _ = equivalence_step(1, {}, inputs, tmp_path, tf_python)
    eight, rec = equivalence_step(8, {}, inputs, tmp_path, tf_python)
    assert rec["result"]["allreduce"] == "hierarchical"
    assert rec["result"]["gradient_packer"].startswith("skipped")
    assert short(rec["placement"]) == {f"CPU:{k}" for k in range(8)}
    assert one, "the step wrote no weights"
    for name in one:
        np.testing.assert_allclose(eight[name], one[name], rtol=RTOL, atol=1e-6, err_msg=name)


def test_gradient_packer_at_eight_towers(tmp_path: Path, tf_python: str) -> None:
    """MiniGoogLeNet at 8 towers: tensorpack's default packs the gradients into 8 splits for
    the hierarchical all-reduce, and the step equals the one without packer (mode gpu) from
    the same weights, batch and dropout seed."""
    packer = "tests/children/tensorpack_gradient_packer.py"
    packed = run_child(tf_python, packer, "auto", str(tmp_path / "packed.npz"))
    assert packed["allreduce"] == "hierarchical"
    assert packed["gradient_packer"] == {"towers": 8, "splits": 8}
    assert short(packed["placement"]) == {f"CPU:{k}" for k in range(8)}
    plain = run_child(tf_python, packer, "gpu", str(tmp_path / "plain.npz"))
    assert plain["allreduce"] == "gpu" and plain["gradient_packer"].startswith("not used")
    with np.load(tmp_path / "packed.npz") as a, np.load(tmp_path / "plain.npz") as b:
        assert sorted(a.files) == sorted(b.files) and len(a.files) > 20
        for name in a.files:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
