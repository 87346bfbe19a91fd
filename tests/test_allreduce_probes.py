"""The all-reduce probes of mode allreduce (issue 17) for real on CPU, each through the CLI as a
user runs it: 2 virtual CPU devices, MiniGoogLeNet's sizes (1 MiB .. its gradient bytes), one
warm-up and two timed all-reduces per size. Each test checks that the probe's framework summed
every size correctly on 2 replicas, that the figures are nccl-tests' and positive, and that
the evidence read back from the framework says what ran (2 replicas on 2 devices, the
collective its users get)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.records.store import check_record, load_records
from bench.run.envs import ensure_env
from contract.collectives import bus_factor, check_collectives, probe_sizes
from tests.helpers.cli import run_cli

CONFIG = """\
name: probe-{probe}
mode: allreduce
probes: [{probe}]
models: [minigooglenet]
devices: [2]
device: cpu
warmup_steps: 1
measure_steps: 2
timeout_s: 300
"""


def probe_run(tmp_path: Path, probe: str) -> dict:  # the allreduce section, + collectives
    """One probe at 2 virtual CPU devices through run_bench.py; its record, checked ok with a
    correct, positive nccl-tests row for every size of MiniGoogLeNet and 2 replicas in the
    framework's own evidence. Returns the result's allreduce section."""
    config = tmp_path / "probe.yaml"
    config.write_text(CONFIG.format(probe=probe))
    out = tmp_path / "out"
    proc = run_cli("--config", str(config), "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = load_records(out)
    log = Path(rec["log_path"]).read_text()[-3000:] if rec.get("log_path") else ""
    assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
    assert check_record(rec) == []
    assert rec["mode"] == "allreduce" and rec["runner"] == probe and rec["num_devices"] == 2
    probe_out = rec["result"]["allreduce"]
    rows = probe_out["sizes"]
    assert [r["bytes"] for r in rows] == probe_sizes("minigooglenet")
    for row in rows:
        assert row["correct"] is True, row
        assert row["iters"] == 2 and row["time_s"] > 0
        assert math.isclose(row["algbw_gbps"], row["bytes"] / row["time_s"] / 1e9)
        assert math.isclose(row["busbw_gbps"], row["algbw_gbps"] * bus_factor(2))
        assert 0 < row["busbw_gbps"] < math.inf
    assert probe_out["busbw_gbps"] == rows[-1]["busbw_gbps"] > 0
    # issue 27: the all-gather and reduce-scatter sections pass the parent's check (an
    # unavailable one with the framework's reason)
    assert check_collectives(rec["result"], 2, "minigooglenet") == []
    evidence = probe_out["evidence"]
    assert evidence["world_size"] == 2 and evidence["replicas"] == 2
    assert len(set(evidence["devices"])) == 2
    return {**probe_out, "collectives": rec["result"].get("collectives")}


@pytest.fixture(scope="module")
def horovod_python() -> str:
    """The Horovod environment's interpreter, built (from source, minutes) on first use."""
    return str(ensure_env("horovod", "cpu").python)


@pytest.mark.slow  # the framework runs in a child
@pytest.mark.framework("tf")
def test_tf_probe_sums_with_collective_ring_on_two_virtual_cpus(tmp_path: Path,
                                                                tf_python: str) -> None:
    probe = probe_run(tmp_path, "tf_allreduce")
    evidence = probe["evidence"]
    assert evidence["cross_device_ops"] == "CollectiveAllReduce"
    assert evidence["communication_implementation"] == "RING"
    assert evidence["devices"] == [f"/job:localhost/replica:0/task:0/device:CPU:{i}"
                                   for i in range(2)]
    # one CollectiveReduceV2 per replica's device, asking for the ring, as TF placed them
    collectives = evidence["collective_ops"]
    assert collectives["communication_hints"] == ["ring"]
    assert list(collectives["by_device"].values()) == [{"CollectiveReduceV2": 1}] * 2
    assert sorted(collectives["by_device"]) == evidence["devices"]
    sections = probe["collectives"]
    assert sections["all_gather"]["status"] == "ok"
    assert "all_gather" in sections["all_gather"]["implementation"]
    assert sections["reduce_scatter"]["status"] == "unavailable"
    assert "has no reduce-scatter" in sections["reduce_scatter"]["reason"]


@pytest.mark.slow  # the framework runs in a child
@pytest.mark.framework("mxnet")
def test_mxnet_probe_sums_through_device_kvstore_over_two_cpu_contexts(tmp_path: Path,
                                                                      mxnet_python: str
                                                                      ) -> None:
    probe = probe_run(tmp_path, "mxnet_allreduce")
    evidence = probe["evidence"]
    assert evidence["kvstore_type"] == "device" and evidence["num_workers"] == 1
    assert evidence["pushed_contexts"] == evidence["pulled_contexts"] == ["cpu(0)", "cpu(1)"]
    sections = probe["collectives"]
    assert [sections[k]["status"] for k in ("all_gather", "reduce_scatter")] == \
        ["unavailable"] * 2
    assert "KVStore" in sections["all_gather"]["reason"]


@pytest.mark.slow  # the framework runs in a child
@pytest.mark.framework("jax")
def test_jax_probe_runs_xlas_collectives_under_shard_map_on_two_virtual_cpus(
        tmp_path: Path, jax_python: str) -> None:
    probe = probe_run(tmp_path, "jax_allreduce")
    evidence = probe["evidence"]
    assert evidence["devices"] == evidence["output_devices"] == ["cpu:0", "cpu:1"]
    assert evidence["mesh"] == {"x": 2} and evidence["platform"] == "cpu"
    # XLA compiled each jitted shard_map into the one collective it names, over both devices
    hlo = evidence["hlo_collectives"]
    for name, op in (("all_reduce", "all-reduce"), ("all_gather", "all-gather"),
                     ("reduce_scatter", "reduce-scatter")):
        assert hlo[name] == {"ops": {op: 1}, "groups": ["replica_groups={{0,1}}"]}, hlo
    sections = probe["collectives"]
    assert {k: v["status"] for k, v in sections.items()} == {"all_gather": "ok",
                                                              "reduce_scatter": "ok"}
    assert sections["all_gather"]["implementation"].startswith("jax.lax.all_gather")
    assert sections["reduce_scatter"]["implementation"].startswith("jax.lax.psum_scatter")


@pytest.mark.slow
@pytest.mark.framework("horovod")
def test_horovod_probe_sums_over_two_gloo_ranks(tmp_path: Path, horovod_python: str) -> None:
    probe = probe_run(tmp_path, "horovod_allreduce")
    evidence = probe["evidence"]
    assert evidence["devices"] == ["rank0:cpu", "rank1:cpu"]
    assert evidence["local_size"] == 2
    assert evidence["controller"] == "gloo" and evidence["gloo_enabled"] is True
    # Horovod's own timeline of one all-reduce: the reduction ran as gloo's
    assert evidence["operation"] == "GLOO_ALLREDUCE", evidence["timeline_activities"]
    sections = probe["collectives"]
    assert {k: v["status"] for k, v in sections.items()} == {"all_gather": "ok",
                                                              "reduce_scatter": "ok"}
    assert sections["all_gather"]["implementation"].startswith("hvd.allgather")
    assert sections["reduce_scatter"]["implementation"].startswith("hvd.reducescatter")
