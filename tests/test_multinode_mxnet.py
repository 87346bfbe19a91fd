"""mxnet_native across the local 2-node SLURM cluster (tools/local_slurm.sh, docs/SLURM.md),
started as the harness starts a multi-node run (issue 16): one process per node through srun,
each `python -m runners.mxnet.native --spec S --result R` with MGBENCH_PROCESS_RANK,
MGBENCH_NUM_NODES, MGBENCH_MASTER_ADDR and MGBENCH_MASTER_PORT set. Each process starts its
node's ps-lite roles (the scheduler on node rank 0, a server on each node;
runners/mxnet/dist_launch.py) and is the node's worker of a dist_sync kvstore; process 0
writes the result.

Checked from the result: status ok and a result the parent accepts (bench.run.launch's
validate_result: samples, finite losses, a placement over every device); MXNet's own account
of the run (kv.type dist_sync, kv.num_workers 2, each worker's kv.rank) and ps-lite's (its
scheduler registered 2 workers and 2 servers, at the ports the job was given); `nodes`
gathered through the kvstore naming node1 and node2; a placement with one key per context of
both workers. Then that the scheduler and both servers ended by themselves when the workers
ended the kvstore, and that no role process is left. One equivalence step across 2 nodes
must give the weights of a 1-device step (so the servers' sum and trainer.step's 1/B make
the gradient of the global mean loss). A 2-node converge sweep through the CLI reaches the
digits target (issue 40). Without SLURM: a worker killed outright, or one whose run raised,
leaves no role behind.

Both "nodes" are this one 2-core machine, shared with the rest of the suite, and a 2-node run
starts five MXNet interpreters (2 workers, 2 servers, the scheduler): the 2-node benchmark takes
8 s on an idle machine and about 45 s beside a CI run (the equivalence test 11 s and 100 to 140
s; the converge sweep 37 s under load; the tests without SLURM 5 to 12 s each), plus any wait
for the cluster's nodes, so every test is `slow`.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.plan.runs import RunSpec
from bench.run.verdict import validate_result
from tests.helpers.cli import REPO
from tests.helpers.equivalence import equivalence_spec, load_weights, make_inputs
from tests.helpers.sweeps import assert_stopped_at_target, two_node_converge_sweep
from tests.specs import run_spec

pytestmark = [pytest.mark.slow, pytest.mark.framework("mxnet")]
slurm = pytest.mark.slurm

MODULE = "runners.mxnet.native"
ROLE_MODULE = "runners.mxnet.dist_launch"
SRUN_TIMEOUT_S = 900
ENDED = "exited after the workers ended the kvstore"


def free_ports(count: int = 10) -> int:
    """A base port with `count` ports from it free right now (the harness reserves 10 per
    job: MGBENCH_MASTER_PORT .. +9)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {count} free ports in a row")


def role_processes(port: int) -> list[tuple[int, str]]:
    """Live ps-lite role processes (runners.mxnet.dist_launch) of the run whose scheduler
    listens on `port` (their command lines end with `--root ADDRESS:PORT`)."""
    marker, found = f":{port} ", []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if ROLE_MODULE in cmd and cmd.endswith(marker) and state != "Z":
            found.append((int(entry.name), cmd))
    return found


def multi_spec(**fields: Any) -> RunSpec:
    return run_spec(runner="mxnet_native", family="mxnet", module=MODULE, num_nodes=2,
                    **fields)


def srun_runner(env: dict[str, str], python: str, spec: RunSpec, tmp_path: Path
                ) -> tuple[dict[str, Any], int, str]:
    """Run the spec on both nodes through srun, one process per node, as the harness does
    (--kill-on-bad-exit, as bench/run/slurm_job.py); (process 0's result, the job's base port,
    srun's output)."""
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    port = free_ports()
    child = (f"MGBENCH_PROCESS_RANK=$SLURM_PROCID MGBENCH_NUM_NODES=$SLURM_NNODES "
             f"MGBENCH_MASTER_ADDR=node1 MGBENCH_MASTER_PORT={port} PYTHONPATH={REPO} "
             f"{python} -m {spec.module} --spec {spec_path} --result {result_path}")
    proc = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--time=10",
         "--job-name=mgbench-test-mxnet", "bash", "-c", child], cwd=REPO,
        capture_output=True, text=True, timeout=SRUN_TIMEOUT_S,
        env={**env, "PYTHONPATH": str(REPO)})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"srun rc {proc.returncode}:\n{output[-4000:]}"
    # both workers ran and ended ok (each prints its own status line)
    assert output.count("status=ok") == 2, output[-4000:]
    return json.loads(result_path.read_text()), port, output


def check_roles_ended(result: dict[str, Any], port: int, output: str) -> None:
    """The scheduler and both servers ended by themselves when the workers freed the kvstore
    (not killed), and none is left."""
    multi = result["multi_node"]
    assert multi["scheduler"]["returncode"] == 0, multi["scheduler"]
    assert multi["scheduler"]["ended"] == ENDED, multi["scheduler"]
    # node rank 0 knows its own server's end; node 1's is in node 1's log line
    assert multi["servers"][0]["returncode"] == 0 and multi["servers"][0]["ended"] == ENDED
    for node in (0, 1):
        assert f"[mxnet dist] node {node}: server pid" in output, output[-4000:]
    assert output.count(f"{ENDED}, exit status 0") == 3, output[-4000:]
    assert "killed" not in output, output[-4000:]
    assert role_processes(port) == []


@slurm
def test_mxnet_native_across_two_nodes(local_slurm: dict[str, str], mxnet_python: str,
                                       tmp_path: Path) -> None:
    spec = multi_spec(num_devices=2, global_batch_size=16, batch_size_per_device=8,
                      warmup_steps=1, measure_steps=2, model="minigooglenet")
    result, port, output = srun_runner(local_slurm, mxnet_python, spec, tmp_path)
    assert result["status"] == "ok", result.get("reason")
    assert validate_result(result, spec) == []
    # MXNet's account: a dist_sync kvstore of 2 workers, the servers only summing
    multi = result["multi_node"]
    assert multi["kv_type"] == "dist_sync" and result["kvstore"] == "dist_sync"
    assert multi["kv_num_workers"] == 2
    assert multi["update_on_kvstore"] is False
    assert [w["kv_num_workers"] for w in multi["workers"]] == [2, 2]
    assert multi["kv_rank_is_node_rank"] is True
    dmlc = multi["dmlc"]
    assert dmlc["DMLC_NUM_WORKER"] == dmlc["DMLC_NUM_SERVER"] == "2"
    assert dmlc["DMLC_PS_ROOT_PORT"] == str(port) and dmlc["DMLC_ROLE"] == "worker"
    # ps-lite's account: its scheduler registered 2 servers and 2 workers, at our ports
    scheduler = multi["scheduler"]
    assert scheduler["node"] == "node1" and scheduler["address"].endswith(f":{port}")
    assert scheduler["ps_lite_connected"] == {"workers": 2, "servers": 2}
    assigned = {(a["role"], a["port"]) for a in scheduler["ps_lite_assigned"]}
    assert assigned == {("server", port + 1), ("server", port + 2), ("worker", port + 3),
                        ("worker", port + 4)}
    assert [s["node"] for s in multi["servers"]] == ["node1", "node2"]
    assert all(s["running_at_gather"] for s in multi["servers"])
    # the nodes, gathered through the kvstore
    nodes = result["nodes"]
    assert [n["node"] for n in nodes] == ["node1", "node2"]
    assert [n["kv_rank"] for n in nodes] == [0, 1]
    assert [n["process_rank"] for n in nodes] == [0, 1]
    assert [n["slurm_procid"] for n in nodes] == ["0", "1"]
    assert len({n["slurm_job_id"] for n in nodes}) == 1 and nodes[0]["slurm_job_id"]
    assert len({n["pid"] for n in nodes}) == 2
    # one placement key per context of both workers, each with its 8 rows
    assert result["placement"] == {"worker0:cpu(0)": 8, "worker1:cpu(0)": 8}
    assert set(result["parameter_copies"]) == set(result["placement"])
    assert [d["name"] for d in result["devices"]] == ["worker0:cpu(0)", "worker1:cpu(0)"]
    assert all(math.isfinite(result[k]) for k in ("first_loss", "last_loss"))
    assert result["samples"] == spec.measure_steps * spec.global_batch_size == 32
    assert result["replicas"] == 2
    check_roles_ended(result, port, output)



@slurm
def test_one_step_across_two_nodes_equals_one_device(local_slurm: dict[str, str],
                                                     mxnet_python: str,
                                                     tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_dir.mkdir()
    two_dir.mkdir()
    one = equivalence_spec("mxnet_native", "mxnet", MODULE, 1, inputs, one_dir / "weights.npz")
    (one_dir / "spec.json").write_text(json.dumps(one.to_dict()))
    proc = subprocess.run(
        [mxnet_python, "-m", MODULE, "--spec", str(one_dir / "spec.json"), "--result",
         str(one_dir / "result.json")], cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    two = equivalence_spec("mxnet_native", "mxnet", MODULE, 2, inputs, two_dir / "weights.npz")
    result, port, output = srun_runner(local_slurm, mxnet_python, two, two_dir)
    assert result["status"] == "ok", result.get("reason")
    assert result["multi_node"]["kv_num_workers"] == 2
    assert result["placement"] == {"worker0:cpu(0)": 8, "worker1:cpu(0)": 8}
    single = json.loads((one_dir / "result.json").read_text())
    assert result["loss"] == pytest.approx(single["loss"], rel=1e-5)
    initial, w1, w2 = (load_weights(p) for p in (inputs, one_dir / "weights.npz",
                                                 two_dir / "weights.npz"))
    assert set(w1) == set(w2) == set(initial)
    for name in initial:
        assert np.abs(w1[name] - initial[name]).max() > 1e-3, f"{name} did not move"
        np.testing.assert_allclose(w2[name], w1[name], rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name} differs between 2 nodes and 1 device")
    check_roles_ended(result, port, output)



@slurm
def test_a_two_node_converge_sweep_reaches_the_digits_target(
        local_slurm: dict[str, str], mxnet_python: str, digits_dataset: Path,
        tmp_path: Path) -> None:
    """Issue 40: configs/converge-digits.yaml's recipe on the local cluster's two nodes, a
    worker on each (one CPU context) over the dist_sync kvstore, to its 95% target: one record
    of both workers, which started from worker 0's broadcast weights."""
    proc, rec = two_node_converge_sweep(tmp_path / "out", digits_dataset, "mxnet_native",
                                        local_slurm)
    assert rec["status"] == "ok", rec["reason"]
    assert rec["num_nodes"] == 2 and rec["num_devices"] == 2
    assert_stopped_at_target(rec, rec["converge"]["target_accuracy"])
    result = rec["result"]
    assert sorted(n["node"] for n in rec["slurm"]["nodes"]) == ["node1", "node2"]
    assert [n["node"] for n in result["nodes"]] == ["node1", "node2"]  # as MXNet's kv ranks
    multi = result["multi_node"]
    assert (multi["kv_type"], multi["kv_num_workers"]) == ("dist_sync", 2)
    assert multi["update_on_kvstore"] is False
    # each worker trained its half of every global batch of 64 (last_batch drop)
    half = 1437 // 64 * 64 // 2
    assert rec["placement"] == {"worker0:cpu(0)": half, "worker1:cpu(0)": half}
    assert result["replicas"] == 2 and result["kvstore"] == "dist_sync"
    # both workers hold worker 0's initial weights, read back after the kvstore's init
    initial = result["initial_weights"]
    assert initial["workers_identical"] and initial["contexts_identical"]
    assert [w["broadcast"] for w in initial["workers"]] == [initial["sha256"]] * 2
    # the rate the Trainer applied: the recipe's for the global batch (linear: 2 x 0.01)
    assert result["optimizer"]["epoch_start_lr"][0] == pytest.approx(0.02)
    assert result["optimizer"]["steps"] == sum(p["steps"] for p in rec["curve"])
    assert "2x1 vcpu" in proc.stdout  # the converge table's devices: nodes x devices


READY = re.compile(r"READY (\d+) (\d+) (\d+)")


@pytest.mark.parametrize("how", ["killed", "raise"])
def test_roles_end_with_their_worker(how: str, mxnet_python: str) -> None:
    port = free_ports()
    env = {**os.environ, "PYTHONPATH": str(REPO), "MGBENCH_PROCESS_RANK": "0",
           "MGBENCH_NUM_NODES": "1", "MGBENCH_MASTER_ADDR": "localhost",
           "MGBENCH_MASTER_PORT": str(port), "DMLC_NODE_HOST": "127.0.0.1"}
    worker = subprocess.Popen([mxnet_python, str(REPO / "tests/children/mxnet_role_worker.py"),
                               how], cwd=REPO, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert worker.stdout is not None
        for line in worker.stdout:  # (ps-lite's C++ log may share a line with READY)
            lines.append(line)
            if READY.search(line):
                break
        ready = READY.search("".join(lines))
        assert ready is not None, "".join(lines)[-3000:]
        assert ready[1] == "1"  # one worker, and the scheduler's and the server's pids
        assert len(role_processes(port)) == 2
        rest = ""
        if how == "killed":  # (its output pipe stays open while a role lives: no read)
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=60)
        else:
            rest = worker.communicate("go\n", timeout=120)[0]
        deadline = time.time() + 30
        while role_processes(port) and time.time() < deadline:
            time.sleep(0.5)
        assert role_processes(port) == [], "".join(lines) + rest
        if how == "raise":
            assert worker.returncode == 0, "".join(lines) + rest
            assert "RAISED the run failed ['killed (SIGTERM) by the worker', 'killed " \
                   "(SIGTERM) by the worker']" in rest, rest
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pid, _ in role_processes(port):  # what a failed check left behind
            os.kill(pid, signal.SIGKILL)

