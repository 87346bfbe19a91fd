"""The JAX runners across the local 2-node SLURM cluster (tools/local_slurm.sh, docs/SLURM.md),
started as the harness starts a multi-node run (issue 16): one process per node through srun,
each `python -m runners.jax.<runner> --spec S --result R` with MGBENCH_PROCESS_RANK,
MGBENCH_NUM_NODES, MGBENCH_MASTER_ADDR and MGBENCH_MASTER_PORT set. The processes join through
jax.distributed.initialize()'s SLURM auto-detection (keras_jax through
keras.distribution.initialize()), gloo between them; process 0 writes the result.

Checked from the result: status ok and a result the parent accepts (bench.run.launch's
validate_result: samples, finite losses, a placement over every device); JAX's own account of
the run (2 processes, the device counts, SlurmCluster, gloo, the coordinator on node1 at the
port the harness reserved); `nodes` gathered through JAX naming node1 and node2 with their
local devices; a placement with one key per device of both processes (jax_fsdp: its state
split over the two processes' devices). jax_native also runs
2 nodes x 2 virtual CPU devices each (gloo works with several local CPU devices per process in
jax 0.10.2), and one equivalence step of each runner across 2 nodes must give the weights of a
1-device step (so the gradients really were averaged across the processes).

Both "nodes" are this one 2-core machine, shared with the rest of the suite, so a run takes a
minute or two: every test is `slow` as well as `slurm`.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.plan.runs import RunSpec
from bench.run.verdict import validate_result
from tests.helpers.cli import REPO
from tests.helpers.equivalence import equivalence_spec, load_weights, make_inputs
from tests.helpers.sharding import assert_split
from tests.specs import run_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.framework("jax")]

MODULES = {"jax_native": "runners.jax.native", "keras_jax": "runners.jax.keras_jax",
           "jax_fsdp": "runners.jax.fsdp"}
MECHANISMS = {"jax_native": "jax.distributed.initialize, SLURM auto-detection",
              "jax_fsdp": "jax.distributed.initialize, SLURM auto-detection",
              "keras_jax": "keras.distribution.initialize -> jax.distributed.initialize, "
                           "SLURM auto-detection"}
SRUN_TIMEOUT_S = 900


def free_port() -> int:
    """A TCP port free right now (the harness reserves one per job; so does each test)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def multi_spec(runner: str, **fields: Any) -> RunSpec:
    """A 2-node benchmark spec of small_cnn: the tests check how the processes join and lay
    the batch out, where the model does not matter (small_cnn compiles 3x faster than
    MiniGoogLeNet, the spec's default)."""
    return run_spec(runner=runner, family="jax", module=MODULES[runner], num_nodes=2,
                    model="small_cnn", **fields)


def srun_runner(env: dict[str, str], python: str, spec: RunSpec, tmp_path: Path
                ) -> tuple[dict[str, Any], int]:
    """Run the spec on both nodes through srun, one process per node, as the harness does;
    (process 0's result, the coordinator port the run was given)."""
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    port = free_port()
    child = (f"MGBENCH_PROCESS_RANK=$SLURM_PROCID MGBENCH_NUM_NODES=$SLURM_NNODES "
             f"MGBENCH_MASTER_ADDR=node1 MGBENCH_MASTER_PORT={port} PYTHONPATH={REPO} "
             f"CUDA_VISIBLE_DEVICES= {python} -m {spec.module} --spec {spec_path} "
             f"--result {result_path}")
    proc = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "--time=10", "--job-name=mgbench-test-jax",
         "bash", "-c", child], cwd=REPO, capture_output=True, text=True,
        timeout=SRUN_TIMEOUT_S, env={**env, "PYTHONPATH": str(REPO)})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"srun rc {proc.returncode}:\n{output[-4000:]}"
    # both processes ran and ended ok (each prints its own status line)
    assert output.count("status=ok") == 2, output[-4000:]
    return json.loads(result_path.read_text()), port


def check_multi_node(result: dict[str, Any], spec: RunSpec, port: int, runner: str) -> None:
    """What JAX says of the run, the nodes gathered through it, and the placement."""
    assert result["status"] == "ok", result.get("reason")
    assert validate_result(result, spec) == []
    assert result["params"] == 60_746  # small_cnn's, BatchNorm's statistics included
    per_node = spec.devices_per_node
    multi = result["multi_node"]
    assert multi["mechanism"] == MECHANISMS[runner]
    assert multi["cluster_detected"] == "SlurmCluster"
    assert multi["process_count"] == 2
    assert multi["device_count"] == spec.num_devices
    assert multi["local_device_count"] == per_node
    assert multi["cpu_collectives"] == "gloo"
    # SlurmCluster took node1 (first of SLURM_STEP_NODELIST); the port is the reserved one
    assert multi["coordinator_address"] == f"node1:{port}"
    nodes = result["nodes"]
    assert [n["node"] for n in nodes] == ["node1", "node2"]
    assert [n["process_index"] for n in nodes] == [0, 1]
    assert [n["slurm_procid"] for n in nodes] == ["0", "1"]
    assert len({n["slurm_job_id"] for n in nodes}) == 1 and nodes[0]["slurm_job_id"]
    assert len({n["pid"] for n in nodes}) == 2
    assert all(len(n["local_devices"]) == per_node for n in nodes)
    all_devices = [d for n in nodes for d in n["local_devices"]]
    assert len(set(all_devices)) == spec.num_devices
    # one placement key per device of both processes, each naming its process, rows even
    placement = result["placement"]
    assert len(placement) == spec.num_devices, placement
    for node in nodes:
        for device in node["local_devices"]:
            key = f"{device} (process {node['process_index']})"
            assert placement.get(key) == spec.global_batch_size // spec.num_devices, placement
    assert sum(placement.values()) == spec.global_batch_size
    assert all(math.isfinite(result[k]) for k in ("first_loss", "last_loss"))
    assert result["samples"] == spec.measure_steps * spec.global_batch_size
    assert result["replicas"] == spec.num_devices
    assert [d["process_index"] for d in result["devices"]] == sorted(
        [n["process_index"] for n in nodes] * per_node)


# jax_native's benchmark across nodes is checked at 2 devices per node (below): the same
# checks, and a one-device-per-node run of it would add a minute to the suite for nothing
@pytest.mark.parametrize("runner", ["keras_jax", "jax_fsdp"])
def test_runner_across_two_nodes(runner: str, local_slurm: dict[str, str], jax_python: str,
                                 tmp_path: Path) -> None:
    spec = multi_spec(runner, num_devices=2, global_batch_size=16, batch_size_per_device=8,
                      warmup_steps=1, measure_steps=2)
    result, port = srun_runner(local_slurm, jax_python, spec, tmp_path)
    check_multi_node(result, spec, port, runner)
    if runner == "keras_jax":
        keras = result["multi_node"]["keras_distribution"]
        assert keras["num_processes"] == 2 and keras["auto_shard_dataset"] is False
        assert result["host_dataset"]["rows_per_process"] == 8
    if runner == "jax_fsdp":  # each process's shards, gathered through JAX: half per device
        assert_split(result, 2)
        assert all(key.endswith(f"(process {i})") for i, key in enumerate(
            sorted(result["state_bytes_per_device"])))


def test_jax_native_two_nodes_two_devices_each(local_slurm: dict[str, str], jax_python: str,
                                               tmp_path: Path) -> None:
    spec = multi_spec("jax_native", num_devices=4, global_batch_size=16,
                      batch_size_per_device=4, warmup_steps=1, measure_steps=2)
    result, port = srun_runner(local_slurm, jax_python, spec, tmp_path)
    check_multi_node(result, spec, port, "jax_native")
    assert result["collectives"]["all-reduce"] >= 1



@pytest.mark.parametrize("runner", sorted(MODULES))
def test_one_step_across_two_nodes_equals_one_device(runner: str, local_slurm: dict[str, str],
                                                     jax_python: str, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_dir.mkdir()
    two_dir.mkdir()
    one = equivalence_spec(runner, "jax", MODULES[runner], 1, inputs, one_dir / "weights.npz")
    (one_dir / "spec.json").write_text(json.dumps(one.to_dict()))
    proc = subprocess.run(
        [jax_python, "-m", one.module, "--spec", str(one_dir / "spec.json"), "--result",
         str(one_dir / "result.json")], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    two = equivalence_spec(runner, "jax", MODULES[runner], 2, inputs, two_dir / "weights.npz")
    result, _ = srun_runner(local_slurm, jax_python, two, two_dir)
    assert result["status"] == "ok", result.get("reason")
    assert result["multi_node"]["process_count"] == 2
    assert len(result["placement"]) == 2, result["placement"]
    initial, w1, w2 = (load_weights(p) for p in (inputs, one_dir / "weights.npz",
                                                 two_dir / "weights.npz"))
    assert set(w1) == set(w2) == set(initial)
    for name in initial:
        assert np.abs(w1[name] - initial[name]).max() > 1e-3, f"{name} did not move"
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{runner}: {name} differs between 2 nodes and "
                                           "1 device")


def test_a_two_node_converge_sweep_of_jax_native_reaches_the_digits_target(
        local_slurm: dict[str, str], tmp_path: Path, digits_dataset: Path) -> None:
    """Issue 40: time to accuracy across nodes. jax_native on the local cluster's two nodes (a
    process and a device on each, joined by jax.distributed) trains configs/converge-digits.yaml's
    recipe to its target, each process feeding its half of every global batch; the record says
    where the rows went (each process's device, read back from JAX) and that both processes
    evaluated the same held-out accuracy."""
    from tests.helpers.sweeps import assert_stopped_at_target, two_node_converge_sweep

    proc, rec = two_node_converge_sweep(tmp_path / "out", digits_dataset, "jax_native",
                                        local_slurm)
    stdout = proc.stdout
    assert rec["mode"] == "converge" and rec["status"] == "ok", rec.get("reason")
    result = rec["result"]  # the runner's own fields
    assert rec["num_nodes"] == 2 and result["multi_node"]["process_count"] == 2
    assert [n["node"] for n in result["nodes"]] == ["node1", "node2"]
    # one device of each process, each its half of the first epoch's whole batches (drop)
    placement = rec["placement"]
    assert sorted(key.rsplit(" ", 1)[-1] for key in placement) == ["0)", "1)"], placement
    whole = result["converge"]["train_images"] // rec["global_batch_size"]
    assert set(placement.values()) == {whole * rec["global_batch_size"] // 2}, placement
    accuracies = result["heldout_accuracy_per_process"]
    assert accuracies[0] == accuracies[1] == [p["accuracy"] for p in rec["curve"]]
    assert_stopped_at_target(rec, rec["converge"]["target_accuracy"])
    assert "2x1 vcpu" in stdout  # the converge table's devices: nodes x devices
