"""The horovod runner across the local 2-node SLURM cluster (tools/local_slurm.sh,
docs/SLURM.md), through the CLI as a user runs it (cluster.backend slurm, issue 16).

bench/run/slurm_job.py starts one task per node through srun; on each node the harness runs
runners/torch/horovod_launch.py (bench/run/launch.py child_command, launcher horovodrun with a
NodePlace), which does horovodrun 0.28.1's gloo launch with srun in place of ssh: node rank 0
hosts Horovod's RendezvousServer on the job's port + 1 with the host assignment plan of
node1:1,node2:1, and each node starts its rank with the slot environment horovodrun gives it.

Checked from the record: status ok (so the parent's validation passed: samples, finite
losses, a placement over both ranks); SLURM's account (one job on node[1-2], COMPLETED, each
node's part exited 0); Horovod's (hvd.size() 2, cross_size 2, local_size 1, gloo built and
enabled, the rendezvous at the port the job was given); `nodes` gathered with
hvd.allgather_object naming node1 and node2, one rank each; one placement key per rank.

Both "nodes" are this one 2-core machine, shared with the rest of the suite: the run itself
takes about half a minute, plus any wait for the cluster's nodes, so the test is `slow`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from contract.reasons import sentence
from tests.helpers.cli import run_cli

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.framework("horovod")]

RUN_ID = "horovod__minigooglenet__2x1__b8__synthetic__fp32__r0"
SWEEP = {"runners": ["horovod"], "models": ["minigooglenet"], "nodes": [2], "devices": [1],
         "batch_size_per_device": 8, "warmup_steps": 1, "measure_steps": 3, "timeout_s": 300,
         "telemetry": {"interval_s": 0.5},
         "cluster": {"backend": "slurm", "partition": "debug", "poll_s": 1}}


def test_horovod_across_two_nodes_through_the_cli(local_slurm: dict[str, str],
                                                  tmp_path: Path) -> None:
    cfg, out = tmp_path / "sweep.yaml", tmp_path / "out"
    cfg.write_text(yaml.safe_dump(SWEEP))
    proc = run_cli("--config", str(cfg), "--out", str(out), env=local_slurm, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads((out / "runs" / f"{RUN_ID}.json").read_text())
    logs = "\n".join(Path(n["log_path"]).read_text()[-3000:]
                     for n in rec.get("slurm", {}).get("nodes", []) if n.get("log_path"))
    assert rec["status"] == "ok", f"{rec['reason']}\n{logs}"
    assert rec["num_nodes"] == 2 and rec["num_devices"] == 2
    # SLURM's account: one job on both nodes, each node's part ended well
    slurm = rec["slurm"]
    assert slurm["node_list"] == "node[1-2]" and slurm["state"] == "COMPLETED"
    assert [n["node"] for n in slurm["nodes"]] == ["node1", "node2"]
    assert all(n["returncode"] == 0 for n in slurm["nodes"]), logs
    # the ranks, as Horovod gathered them
    result = rec["result"]
    nodes = result["nodes"]
    assert [n["node"] for n in nodes] == ["node1", "node2"]
    assert [n["ranks"] for n in nodes] == [[0], [1]]
    assert [n["slurm_procid"] for n in nodes] == ["0", "1"]
    multi = result["multi_node"]
    assert sentence(multi["mechanism"]).startswith("horovodrun's gloo rendezvous")
    assert multi["size"] == multi["world_size"] == 2
    assert multi["cross_size"] == 2 and multi["local_size"] == 1
    assert multi["gloo_built"] and multi["gloo_enabled"] and multi["controller"] == "gloo"
    assert [(r["rank"], r["cross_rank"], r["local_rank"], r["node"]) for r in multi["ranks"]] \
        == [(0, 0, 0, "node1"), (1, 1, 0, "node2")]
    assert [r["slot_env"]["HOROVOD_HOSTNAME"] for r in multi["ranks"]] == ["node1", "node2"]
    # the rendezvous: Horovod's server on the first node, at the job's port + 1, over lo
    rendezvous = multi["rendezvous"]
    job_port = slurm["nodes"][0]["place"]["master_port"]
    assert rendezvous["HOROVOD_GLOO_RENDEZVOUS_PORT"] == str(job_port + 1)
    assert rendezvous["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "127.0.0.1"
    assert rendezvous["HOROVOD_GLOO_IFACE"] == "lo"
    assert rendezvous["HOROVOD_CONTROLLER"] == rendezvous["HOROVOD_CPU_OPERATIONS"] == "gloo"
    assert f"RendezvousServer listening on port {job_port + 1}" in logs
    # one placement key per rank, each with its 8 rows a step
    assert rec["placement"] == {"rank0:cpu": 24, "rank1:cpu": 24}
    assert rec["samples"] == 3 * 16
