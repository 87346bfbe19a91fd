"""tensorpack beyond the generic TF-runner and equivalence tests: the parameter-server trainer
and the plain queue input at 2 devices, towers on 2 distinct devices, parameter counts equal to
the spec, and the equivalence step with the other trainer and input settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.launch import launch
from bench.plan import RunSpec
from bench.records import check_record, load_records
from bench.registry import RUNNERS
from models import get_spec
from tests.conftest import run_cli
from tests.test_equivalence import BATCH, LR, RTOL, make_inputs

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]



def short(devices: list[str]) -> set[str]:
    """Device names without the job/replica/task prefix: {"CPU:0", "CPU:1"}."""
    return {d.split("/device:")[-1] for d in devices}


def sweep(tmp_path: Path, *options: str) -> dict[int, dict]:
    """minigooglenet at 1 and 2 virtual CPU devices, 3 measured steps, with runner options."""
    sets = [a for opt in options for a in ("--set", f"runner_options.tensorpack.{opt}")]
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", "runners=[tensorpack]",
                   "--set", "warmup_steps=2", "--set", "measure_steps=3",
                   "--set", "batch_size_per_device=8", *sets, "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["num_devices"]: r for r in load_records(tmp_path / "out")}
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert check_record(rec) == []
        assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
        assert rec["samples"] == 3 * 8 * n
    return records


def check_towers(result: dict, n: int) -> None:
    """One tower per device, each on its own device, and the devices really ran a step."""
    spec = get_spec("minigooglenet")
    assert result["replicas"] == n
    assert len(result["tower_devices"]) == n
    assert len(set(result["tower_devices"])) == n, result["tower_devices"]
    if n == 2:
        assert short(result["tower_devices"]) == {"CPU:0", "CPU:1"}
        assert short(result["partition_devices"]) == {"CPU:0", "CPU:1"}
    assert result["params"] == spec.params
    assert result["trainable_params"] == spec.trainable_params


def test_parameter_server_with_queue_input(tmp_path: Path, tf_python: str) -> None:
    records = sweep(tmp_path, "trainer=parameter_server", "input=queue")
    for n, rec in records.items():
        result = rec["result"]
        assert result["trainer"] == "SyncMultiGPUTrainerParameterServer"
        assert result["input"] == "QueueInput"
        assert result["ps_device"] == "cpu"
        assert short(result["variable_devices"]) == {"CPU:0"}  # one shared copy, on /cpu:0
        check_towers(result, n)


def test_replicated_with_staging_input_on_distinct_devices(tmp_path: Path,
                                                            tf_python: str) -> None:
    records = sweep(tmp_path)  # the registry defaults: replicated, staging
    for n, rec in records.items():
        result = rec["result"]
        assert result["trainer"] == "SyncMultiGPUTrainerReplicated"
        assert result["input"] == "StagingInput(QueueInput)"
        assert result["allreduce"] == "gpu"
        check_towers(result, n)


def equivalence_step(n: int, options: dict, inputs: Path, tmp_path: Path,
                     python: str) -> dict[str, np.ndarray]:
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
        return {k[2:]: data[k] for k in data.files}


@pytest.mark.parametrize("options", [
    {"trainer": "replicated", "input": "queue"},
    {"trainer": "parameter_server", "input": "staging", "ps_device": "cpu"},
    {"trainer": "parameter_server", "input": "queue", "ps_device": "gpu"},
], ids=["replicated-queue", "ps-cpu-staging", "ps-spread-queue"])
def test_equivalence_other_settings(options: dict, tmp_path: Path, tf_python: str) -> None:
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    one = equivalence_step(1, options, inputs, tmp_path, tf_python)
    two = equivalence_step(2, options, inputs, tmp_path, tf_python)
    with np.load(inputs) as data:
        initial = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    assert set(one) == set(two) == set(initial)
    for name in initial:
        assert np.abs(one[name] - initial[name]).max() > 1e-3, f"{name} did not move"
        np.testing.assert_allclose(two[name], one[name], rtol=RTOL, atol=1e-6, err_msg=name)
