"""The TensorFlow runners tf_native and tf_mirrored across the local 2-node SLURM cluster
(tools/local_slurm.sh, docs/SLURM.md), started as the harness starts a multi-node run
(issue 16): one process per node through srun, each `python -m runners.tf.<runner> --spec S
--result R` with MGBENCH_PROCESS_RANK, MGBENCH_NUM_NODES, MGBENCH_MASTER_ADDR and
MGBENCH_MASTER_PORT set. The processes are the workers of a MultiWorkerMirroredStrategy whose
cluster TF's SlurmClusterResolver resolves (runners/tf/devices.py); worker 0 writes the result.

Checked from the result, each in its own test so that each can fail for its own reason:
status ok and a result the parent accepts (bench.run.launch.validate_result); TF's own account
(num_replicas_in_sync 2, 2 workers, this worker task 0, the cluster spec); `nodes` gathered
through a TF collective naming node1 and node2; a placement with one key per worker device;
finite losses and samples over the global batch; each worker fed its own half of each global
batch (auto-shard DATA; with OFF both would get the same rows); the port adjustment the
one-machine cluster needs (both nodes are 127.0.0.1). One equivalence step of each runner
across 2 nodes must give the weights of a 1-device step, so the gradients really were
all-reduced across the workers. A 2-node converge sweep of tf_mirrored (issue 40) reaches the
digits target, each worker fed its half of the recipe's batches. Without SLURM: the port rule
itself, 2 CPU devices per node (MWMS runs one replica per worker on CPU) and a kept short last
batch that does not split over the workers reported unavailable.

Both "nodes" are this one 2-core machine, shared with the rest of the suite: a 2-node run
takes 10 to 30 s when the cluster is free (TensorFlow's import and the first trace dominate),
longer when srun queues behind other jobs; the file takes 2 to 3 minutes. The 2-node tests are
`slurm` and `slow`; the port rule and the unavailable check need no cluster.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bench.plan.config import load_config
from bench.plan.runs import RunSpec, expand
from bench.run.verdict import validate_result
from contract.reasons import sentence
from runners.converge import Recipe, epoch_batches, load_splits
from tests.helpers.cli import REPO, run_child
from tests.helpers.equivalence import equivalence_spec, load_weights, make_inputs
from tests.specs import run_spec

pytestmark = pytest.mark.framework("tf")

MODULES = {"tf_native": "runners.tf.native", "tf_mirrored": "runners.tf.mirrored"}
SRUN_TIMEOUT_S = 900
WARMUP, MEASURE, GLOBAL = 1, 2, 16


def free_ports(count: int = 2) -> int:
    """The first of `count` consecutive TCP ports free right now (the harness reserves
    MGBENCH_MASTER_PORT..+9 per job; each run here takes its own)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


def multi_spec(runner: str, **fields: Any) -> RunSpec:
    return run_spec(runner=runner, family="tf", module=MODULES[runner], num_nodes=2, **fields)


def srun_runner(env: dict[str, str], python: str, spec: RunSpec, tmp_path: Path
                ) -> tuple[dict[str, Any], int]:
    """Run the spec on both nodes through srun, one process per node, as the harness does;
    (worker 0's result, the port base the run was given)."""
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    port = free_ports(2)
    child = (f"MGBENCH_PROCESS_RANK=$SLURM_PROCID MGBENCH_NUM_NODES=$SLURM_NNODES "
             f"MGBENCH_MASTER_ADDR=node1 MGBENCH_MASTER_PORT={port} PYTHONPATH={REPO} "
             f"CUDA_VISIBLE_DEVICES= {python} -m {spec.module} --spec {spec_path} "
             f"--result {result_path}")
    proc = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "--time=10", "--job-name=mgbench-test-tf",
         "bash", "-c", child], cwd=REPO, capture_output=True, text=True,
        timeout=SRUN_TIMEOUT_S, env={**env, "PYTHONPATH": str(REPO)})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"srun rc {proc.returncode}:\n{output[-4000:]}"
    # both workers ran and ended ok (each prints its own status line)
    assert output.count("status=ok") == 2, output[-4000:]
    return json.loads(result_path.read_text()), port


@pytest.fixture(scope="module", params=sorted(MODULES))
def run(request: pytest.FixtureRequest, local_slurm: dict[str, str], tf_python: str,
        tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSpec, dict[str, Any], int]:
    """One 2-node benchmark of the runner (2 devices, 1 per node, global batch 16), run once
    and shared by the tests that read its result: (spec, worker 0's result, port base)."""
    runner = request.param
    spec = multi_spec(runner, num_devices=2, global_batch_size=GLOBAL,
                      batch_size_per_device=GLOBAL // 2, warmup_steps=WARMUP,
                      measure_steps=MEASURE)
    result, port = srun_runner(local_slurm, tf_python, spec, tmp_path_factory.mktemp(runner))
    return spec, result, port


@pytest.mark.slurm
@pytest.mark.slow
def test_status_ok_and_accepted_by_the_parent(run: tuple) -> None:
    spec, result, _ = run
    assert result["status"] == "ok", result.get("reason")
    assert validate_result(result, spec) == []


@pytest.mark.slurm
@pytest.mark.slow
def test_tf_reads_back_two_replicas_in_sync_over_two_workers(run: tuple) -> None:
    _, result, _ = run
    multi = result["multi_node"]
    assert sentence(multi["mechanism"]).startswith("tf.distribute.MultiWorkerMirroredStrategy")
    assert multi["resolver"] == "SlurmClusterResolver"
    assert multi["num_replicas_in_sync"] == 2
    assert result["replicas"] == 2
    assert multi["num_workers"] == 2
    # worker 0 (the chief) wrote the result
    assert (multi["task_type"], multi["task_id"]) == ("worker", 0)
    assert multi["worker_devices"] == ["/job:worker/replica:0/task:0/device:CPU:0"]
    assert multi["accelerators"]["GPU"] == 0
    # the all-reduce TF put in the step: collective ops on both workers
    for node in result["nodes"]:
        assert node["collective_ops"]["ops"].get("CollectiveReduceV2", 0) >= 1, node


@pytest.mark.slurm
@pytest.mark.slow
def test_nodes_gathered_through_tf_name_node1_and_node2(run: tuple) -> None:
    _, result, _ = run
    nodes = result["nodes"]
    assert [n["node"] for n in nodes] == ["node1", "node2"]
    assert [(n["task_type"], n["task_id"]) for n in nodes] == [("worker", 0), ("worker", 1)]
    assert [n["slurm_procid"] for n in nodes] == ["0", "1"]
    assert [n["is_chief"] for n in nodes] == [True, False]
    assert len({n["slurm_job_id"] for n in nodes}) == 1 and nodes[0]["slurm_job_id"]
    assert len({n["pid"] for n in nodes}) == 2
    assert [n["worker_devices"] for n in nodes] == [
        [f"/job:worker/replica:0/task:{i}/device:CPU:0"] for i in (0, 1)]
    assert [d["node"] for d in result["devices"]] == ["node1", "node2"]


@pytest.mark.slurm
@pytest.mark.slow
def test_placement_has_one_key_per_worker_device(run: tuple) -> None:
    spec, result, _ = run
    placement = result["placement"]
    assert sorted(placement) == [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in (0, 1)]
    assert len(placement) == spec.num_devices
    assert all(count > 0 for count in placement.values()), placement
    # each key comes from the worker that ran it, read from its own partition graphs
    for i, node in enumerate(result["nodes"]):
        assert list(node["placement"]) == [f"/job:worker/replica:0/task:{i}/device:CPU:0"]


@pytest.mark.slurm
@pytest.mark.slow
def test_losses_finite_and_samples_over_the_global_batch(run: tuple) -> None:
    spec, result, _ = run
    assert all(math.isfinite(result[k]) for k in ("first_loss", "last_loss"))
    assert result["samples"] == MEASURE * GLOBAL == spec.measure_steps * spec.global_batch_size
    assert result["timed_steps"] == MEASURE
    assert len(result["step_times_s"]) == MEASURE


@pytest.mark.slurm
@pytest.mark.slow
def test_each_worker_is_fed_its_own_half_of_the_global_batch(run: tuple) -> None:
    _, result, _ = run
    batches = [n["first_batch"] for n in result["nodes"]]
    assert [b["rows"] for b in batches] == [[GLOBAL // 2], [GLOBAL // 2]]
    # different rows: with auto-shard OFF both workers would get the same slice
    assert batches[0]["image_sum"] != batches[1]["image_sum"], batches


@pytest.mark.slurm
@pytest.mark.slow
def test_one_host_ports_made_distinct_and_recorded(run: tuple) -> None:
    _, result, port = run
    multi = result["multi_node"]
    assert multi["port_base"] == port
    # what SlurmClusterResolver gave: the same port on both nodes (one task per node)
    assert multi["cluster_spec_resolved"] == {"worker": [f"node1:{port}", f"node2:{port}"]}
    # both nodes are 127.0.0.1 here: worker 1 moved to port_base + its task index
    assert multi["cluster_spec"] == {"worker": [f"node1:{port}", f"node2:{port + 1}"]}
    assert [(a["task"], a["used"]) for a in multi["port_adjustments"]] == [
        ("worker:1", f"node2:{port + 1}")]
    assert [n["address"] for n in result["nodes"]] == multi["cluster_spec"]["worker"]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(MODULES))
def test_one_step_across_two_nodes_equals_one_device(runner: str, local_slurm: dict[str, str],
                                                     tf_python: str, tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_dir.mkdir()
    two_dir.mkdir()
    one = equivalence_spec(runner, "tf", MODULES[runner], 1, inputs, one_dir / "weights.npz")
    (one_dir / "spec.json").write_text(json.dumps(one.to_dict()))
    proc = subprocess.run(
        [tf_python, "-m", one.module, "--spec", str(one_dir / "spec.json"), "--result",
         str(one_dir / "result.json")], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    two = equivalence_spec(runner, "tf", MODULES[runner], 2, inputs, two_dir / "weights.npz")
    result, _ = srun_runner(local_slurm, tf_python, two, two_dir)
    assert result["status"] == "ok", result.get("reason")
    assert result["multi_node"]["num_replicas_in_sync"] == 2
    assert validate_result(result, two) == []
    initial, w1, w2 = (load_weights(p) for p in (inputs, one_dir / "weights.npz",
                                                 two_dir / "weights.npz"))
    assert set(w1) == set(w2) == set(initial)
    for name in initial:
        assert np.abs(w1[name] - initial[name]).max() > 1e-3, f"{name} did not move"
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{runner}: {name} differs between 2 nodes and "
                                           "1 device")


@pytest.mark.slow  # runners.tf.devices imports tensorflow in the child
def test_ports_change_only_where_two_tasks_share_an_address(tf_python: str) -> None:
    clusters = {
        # one machine under two names (the local cluster): task 1 moves to 5000 + 1
        "one_host": {"worker": ["127.0.0.1:5000", "localhost:5000"]},
        # distinct addresses (a real cluster): nothing changes
        "two_hosts": {"worker": ["127.0.0.1:5000", "127.0.0.2:5000"]},
        # two tasks per node on one host: every task gets 5000 + its global index
        "two_per_node": {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "localhost:5000",
                                    "localhost:5001"]},
    }
    out = run_child(tf_python, "tests/children/tf_distinct_ports.py", json.dumps(clusters))
    cluster, changes = out["one_host"]
    assert cluster == {"worker": ["127.0.0.1:5000", "localhost:5001"]}
    assert [c["task"] for c in changes] == ["worker:1"]
    assert out["two_hosts"] == [clusters["two_hosts"], []]
    cluster, changes = out["two_per_node"]
    assert cluster == {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "localhost:5002",
                                  "localhost:5003"]}
    assert [c["task"] for c in changes] == ["worker:2", "worker:3"]


def run_without_slurm(tf_python: str, spec: RunSpec, tmp_path: Path) -> dict[str, Any]:
    """Worker 0 of a 2-node run started outside SLURM (MGBENCH_* set, no SLURM_*): its result,
    for what is decided before TF resolves the cluster."""
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        [tf_python, "-m", spec.module, "--spec", str(spec_path), "--result", str(result_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**env, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
             "MGBENCH_PROCESS_RANK": "0", "MGBENCH_NUM_NODES": "2",
             "MGBENCH_MASTER_ADDR": "node1", "MGBENCH_MASTER_PORT": str(free_ports(2))})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(result_path.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(MODULES))
def test_two_cpu_devices_per_node_unavailable(runner: str, tf_python: str,
                                              tmp_path: Path) -> None:
    """MWMS runs one replica per worker on CPU: 2 nodes x 2 CPU devices cannot be that run,
    and says so before touching SLURM or the network."""
    spec = multi_spec(runner, num_devices=4, global_batch_size=16, batch_size_per_device=4,
                      warmup_steps=1, measure_steps=1)
    result = run_without_slurm(tf_python, spec, tmp_path)
    assert result["status"] == "unavailable", result
    assert "2 CPU devices per node" in result["reason"], result["reason"]
    assert "one replica per worker" in result["reason"], result["reason"]


@pytest.mark.slow
def test_a_short_kept_batch_that_does_not_split_over_the_workers_is_unavailable(
        tf_python: str, tmp_path: Path, digits_dataset: Path) -> None:
    """Each worker feeds its replicas equal slices: digits' 1,437 training rows in global
    batches of 64 leave 29, which 2 replicas cannot share evenly; said before any cluster."""
    cfg = load_config(REPO / "configs/converge-digits.yaml", [
        f"dataset.path={digits_dataset}", "runners=[tf_mirrored]", "devices=[1]", "nodes=[2]",
        "converge.last_batch=keep", "cluster={backend: slurm, partition: debug}"])
    [spec] = expand(cfg, "s")
    result = run_without_slurm(tf_python, spec, tmp_path)
    assert result["status"] == "unavailable", result
    assert "short last batch of 29 rows" in result["reason"], result["reason"]
    assert "2 replicas" in result["reason"], result["reason"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_two_node_converge_sweep_of_tf_mirrored_reaches_the_digits_target(
        local_slurm: dict[str, str], tmp_path: Path, digits_dataset: Path) -> None:
    """Issue 40: time to accuracy across nodes with MultiWorkerMirroredStrategy. tf_mirrored on
    the local cluster's two nodes (a worker on each) trains configs/converge-digits.yaml's recipe
    to its target; each worker fed its own half of every global batch (read back from TF's
    distributed dataset), every worker's placement and the collective all-reduce gathered
    through TF, the BatchNorm copies of both workers counted."""
    from tests.helpers.sweeps import assert_stopped_at_target, converge_sweep

    [rec] = converge_sweep(tmp_path / "out", digits_dataset, "runners=[tf_mirrored]",
                           "devices=[1]", "nodes=[2]",
                           "cluster={backend: slurm, partition: debug, poll_s: 1}",
                           env=local_slurm)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["num_nodes"] == 2 and rec["result"]["multi_node"]["num_workers"] == 2
    assert rec["result"]["replicas"] == 2
    nodes = rec["result"]["nodes"]
    assert [n["node"] for n in nodes] == ["node1", "node2"]
    assert sorted(rec["placement"]) == [f"/job:worker/replica:0/task:{i}/device:CPU:0"
                                        for i in (0, 1)]
    assert all(n["collective_ops"]["ops"].get("CollectiveReduceV2", 0) >= 1 for n in nodes)
    # what each worker's replica got first, read back from TF: its half of the recipe's first
    # global batch (runners/converge.py), worker 0 the first half
    got = [n["first_batch"] for n in nodes]
    recipe_spec = SimpleNamespace(converge=rec["converge"], dataset={"path": str(digits_dataset)},
                                  global_batch_size=rec["global_batch_size"])
    first = epoch_batches(Recipe.of(recipe_spec), load_splits(recipe_spec), 0)[0]
    half = rec["global_batch_size"] // 2
    assert [b["rows"] for b in got] == [[half], [half]]
    for i, b in enumerate(got):
        rows = slice(i * half, (i + 1) * half)
        assert b["image_sum"] == pytest.approx(float(first.x[rows].astype(np.float64).sum()),
                                               abs=1e-3), (i, b)
        assert b["label_sum"] == int(first.y[rows].sum()), (i, b)
    assert rec["result"]["moving_stat_copies"] == 2 * 2 * 2  # 2 BatchNorm x (mean, var) x 2
    assert_stopped_at_target(rec, rec["converge"]["target_accuracy"])
