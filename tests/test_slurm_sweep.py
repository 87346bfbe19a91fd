"""Sweeps on SLURM (cluster.backend: slurm, bench/run/slurm.py and bench/run/slurm_job.py).

The unit tests check what the parent asks of SLURM and plans; the tests marked `slurm` run
real sweeps on the local 2-node cluster (tools/local_slurm.sh, the `local_slurm` fixture):
a 2-node torch_ddp run through the CLI, a parent stopped while it waits, --detach with
`run_bench.py status`, and a job SLURM kills at its time limit becoming a record (its minute
passing on one node while the 1-node sweeps run on the other)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bench.plan.config import validate
from bench.plan.runs import expand
from bench.run.slurm import batch_script, collect, sbatch_command, time_limit_minutes
from bench.run.sweep import precheck
from tests.helpers.cli import REPO, run_cli
from tests.helpers.slurm import assert_state, submit, wait_final

SMOKE = {"runners": ["torch_ddp"], "models": ["minigooglenet"], "nodes": [2], "devices": [1],
         "batch_size_per_device": 8, "warmup_steps": 1, "measure_steps": 3, "timeout_s": 300,
         "telemetry": {"interval_s": 0.5},
         "cluster": {"backend": "slurm", "partition": "debug", "poll_s": 1}}


def _specs(**changes: object) -> list:
    return expand(validate({**SMOKE, **changes}), "s")


def test_sbatch_asks_for_the_runs_nodes_time_and_the_clusters_settings(tmp_path: Path) -> None:
    spec = _specs(timeout_s=61)[0]
    cluster = {"partition": "gpu", "account": "lab", "exclusive": True, "gpus_per_node": None,
               "sbatch_args": ["--qos=high", "--constraint=a100"]}
    cmd = sbatch_command(spec, cluster, tmp_path / "x.sbatch", tmp_path, after="41")
    assert cmd[:2] == ["sbatch", "--parsable"]
    for arg in ("--nodes=2", "--ntasks-per-node=1", "--time=4", "--partition=gpu",
                "--account=lab", "--exclusive", "--dependency=afterany:41"):
        assert arg in cmd
    assert not any(a.startswith("--gres") for a in cmd)  # a CPU run asks for no GPUs
    assert cmd[-3:] == ["--qos=high", "--constraint=a100", str(tmp_path / "x.sbatch")]
    assert time_limit_minutes(60) == 3 and time_limit_minutes(600) == 12
    gpu = _specs(device="gpu", devices=[4])[0]
    assert "--gres=gpu:4" in sbatch_command(gpu, {"exclusive": False}, tmp_path / "x", tmp_path,
                                            None)
    script = batch_script(spec, "/envs/torch/bin/python", tmp_path)
    assert "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1" in script
    assert "-m bench.run.slurm_job node" in script and "-m bench.run.slurm_job finish" in script


def test_single_machine_runners_are_invalid_across_nodes_before_any_job() -> None:
    specs = expand(validate({**SMOKE, "runners": ["torch_ddp", "keras_tf_kuza55", "horovod",
                                                  "keras_mxnet"], "nodes": [1, 2]}), "s")
    verdicts = {(s.runner, s.num_nodes): precheck(s, None) for s in specs}
    assert verdicts[("torch_ddp", 2)] is None and verdicts[("keras_tf_kuza55", 1)] is None
    for runner in ("keras_tf_kuza55", "keras_mxnet"):
        status, reason = verdicts[(runner, 2)]
        assert status == "invalid" and "single-machine by design" in reason
    # horovod crosses nodes: horovodrun's gloo launch with srun in place of ssh
    # (runners/torch/horovod_launch.py, tests/test_multinode_horovod.py)
    assert verdicts[("horovod", 1)] is None and verdicts[("horovod", 2)] is None


def test_a_multi_node_run_id_names_nodes_and_devices_per_node() -> None:
    ids = [s.run_id for s in _specs(nodes=[1, 2], devices=[1, 2])]
    assert ids == ["torch_ddp__minigooglenet__n1__b8__synthetic__fp32__r0",
                   "torch_ddp__minigooglenet__n2__b8__synthetic__fp32__r0",
                   "torch_ddp__minigooglenet__2x1__b8__synthetic__fp32__r0",
                   "torch_ddp__minigooglenet__2x2__b8__synthetic__fp32__r0"]


# ---- on the local cluster: first the 1-node runs, on node1 while a job's time limit passes
# on node2 (its sweeps' jobs ask --exclusive); then the 2-node runs ----

@pytest.fixture(scope="module")
def time_limited_job(local_slurm: dict[str, str]) -> Iterator[tuple[str, float]]:
    """A one-minute-limit job on node2 that sleeps for five, submitted with the first 1-node
    run so that its minute (and the up to 30 s SLURM takes to notice) passes while the 1-node
    runs go on on node1."""
    job_id = submit(local_slurm, "-N1", "--nodelist=node2", "--time=00:01:00",
                    "--output=/dev/null", "--wrap", "sleep 300")
    yield job_id, time.monotonic()
    subprocess.run(["scancel", job_id], capture_output=True, env=local_slurm)


def _config(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SMOKE, **changes}))
    return path


def _records(out: Path) -> dict[str, dict]:
    recs = {}
    for p in (out / "runs").glob("*.json"):
        if not p.name.endswith((".spec.json", ".result.json")):
            recs[p.stem] = json.loads(p.read_text())
    return recs


def _squeue(env: dict[str, str]) -> str:
    return subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True,
                          env=env, timeout=60).stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("time_limited_job")  # its minute starts now
def test_detach_submits_and_status_collects(local_slurm: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = run_cli("--config", str(_config(tmp_path, nodes=[1])), "--out", str(out),
                   "--detach", env=local_slurm)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 jobs submitted" in proc.stdout and time.monotonic() - t0 < 120
    run_id = "torch_ddp__minigooglenet__n1__b8__synthetic__fp32__r0"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        status = run_cli("status", str(out), env=local_slurm)
        assert status.returncode == 0, status.stdout + status.stderr
        if "recorded" in status.stdout:
            break
        assert run_id in status.stdout and ("pending" in status.stdout
                                            or "running" in status.stdout)
        time.sleep(3)
    assert "recorded: ok" in status.stdout and (out / "summary.csv").exists()
    rec = _records(out)[run_id]
    assert rec["status"] == "ok" and rec["slurm"]["state"] == "COMPLETED"
    # a resume finds nothing to do: the run has its record
    again = run_cli("--config", str(_config(tmp_path, nodes=[1])), "--out", str(out),
                    "--resume", env=local_slurm)
    assert again.returncode == 0 and "1 already done" in again.stdout
    assert "submitted" not in again.stdout


def _field_paths(rec: dict, depth: int = 2, prefix: str = "") -> set[str]:
    """The record's field names, nested ones as a.b down to depth (the values' shapes)."""
    paths = set()
    for key, value in rec.items():
        paths.add(prefix + key)
        if depth > 1 and isinstance(value, dict) and key not in ("slurm", "environment"):
            paths |= _field_paths(value, depth - 1, f"{prefix}{key}.")
    return paths


@pytest.mark.slurm
@pytest.mark.slow
def test_a_slurm_record_and_a_local_record_of_the_same_run_carry_the_same_fields(
        local_slurm: dict, tmp_path: Path) -> None:
    """One supervision path (bench.run.launch.watch and complete): the same run launched here
    and as a SLURM job gives records with the same fields, MFU, placement check and
    telemetry included; the SLURM one adds only its `slurm` section."""
    one_node = {"runners": ["torch_ddp"], "nodes": [1], "devices": [1]}
    recs = {}
    for backend in ("slurm", "local"):
        out = tmp_path / backend
        cluster = {**SMOKE["cluster"], "backend": backend}
        proc = run_cli("--config", str(_config(tmp_path, cluster=cluster, **one_node)),
                       "--out", str(out), env=local_slurm, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        [recs[backend]] = _records(out).values()
    for backend, rec in recs.items():
        assert rec["status"] == "ok", (backend, rec["reason"])
        assert isinstance(rec["mfu"]["mfu"], float) and rec["mfu"]["mfu"] > 0, backend
        assert len(rec["placement_check"]["devices"]) == 1, backend
        assert rec["telemetry"]["samples"] > 0, backend
    assert "slurm" in recs["slurm"] and "slurm" not in recs["local"]
    slurm_fields, local_fields = _field_paths(recs["slurm"]), _field_paths(recs["local"])
    assert slurm_fields - {"slurm"} == local_fields, (
        f"only in the SLURM record: {sorted(slurm_fields - local_fields - {'slurm'})}; "
        f"only in the local one: {sorted(local_fields - slurm_fields)}")


@pytest.mark.slurm
@pytest.mark.slow
def test_time_limit_gives_timeout(local_slurm: dict, time_limited_job: tuple[str, float]
                                  ) -> None:
    job_id, submitted = time_limited_job
    fields = wait_final(local_slurm, job_id, timeout=150 - (time.monotonic() - submitted))
    assert_state(fields, "TIMEOUT")
    assert (fields["Reason"], fields["TimeLimit"]) == ("TimeLimit", "00:01:00")


@pytest.mark.slurm
@pytest.mark.slow
def test_the_harness_records_a_job_slurm_timed_out(
        local_slurm: dict, time_limited_job: tuple[str, float], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """bench.run.slurm.collect on a job SLURM killed at its time limit before the run wrote a
    record (the same job as above, ended by now): a `timeout` record with SLURM's state."""
    job_id, submitted = time_limited_job
    wait_final(local_slurm, job_id, timeout=150 - (time.monotonic() - submitted))
    monkeypatch.setenv("SLURM_CONF", local_slurm["SLURM_CONF"])
    [spec] = expand(validate({"runners": ["torch_ddp"], "models": ["minigooglenet"],
                              "devices": [1], "batch_size_per_device": 8,
                              "cluster": {"backend": "slurm"}}), "s")
    rec = collect(spec, {"job_id": job_id, "python": "python"}, tmp_path, {"host": "h"})
    assert rec["status"] == "timeout" and "TIMEOUT" in rec["reason"], rec["reason"]
    assert rec["slurm"]["state"] == "TIMEOUT" and rec["slurm"]["job_id"] == job_id
    assert json.loads((tmp_path / "runs" / f"{spec.run_id}.json").read_text()) == rec


@pytest.mark.slurm
@pytest.mark.slow
def test_a_two_node_torch_ddp_run_is_one_job_on_both_nodes(local_slurm: dict, tmp_path: Path
                                                            ) -> None:
    out = tmp_path / "out"
    proc = run_cli("--config", str(_config(tmp_path, runners=["torch_ddp", "keras_tf_kuza55"])),
                   "--out", str(out), env=local_slurm, timeout=900)
    # keras_tf_kuza55 across nodes is invalid (below): the sweep exits 3 naming it
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "keras_tf_kuza55__minigooglenet__2x1" in proc.stdout.strip().splitlines()[-1]
    recs = _records(out)
    rec = recs["torch_ddp__minigooglenet__2x1__b8__synthetic__fp32__r0"]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["num_nodes"] == 2 and rec["num_devices"] == 2
    slurm = rec["slurm"]
    assert slurm["job_id"].isdigit() and slurm["node_list"] == "node[1-2]"
    assert slurm["state"] == "COMPLETED" and slurm["queued_s"] is not None
    # each node's own launch: its environment, its exit status, its telemetry
    assert [n["node"] for n in slurm["nodes"]] == ["node1", "node2"]
    assert all(n["returncode"] == 0 and n["environment"]["cpu_model"] for n in slurm["nodes"])
    # the ranks, as the process group gathered them
    assert {n["node"] for n in rec["result"]["nodes"]} == {"node1", "node2"}
    assert rec["result"]["multi_node"]["world_size"] == 2
    assert sorted(rec["placement"]) == ["rank0:cpu", "rank1:cpu"]
    kuza = recs["keras_tf_kuza55__minigooglenet__2x1__b8__synthetic__fp32__r0"]
    assert kuza["status"] == "invalid" and "single-machine by design" in kuza["reason"]
    book = json.loads((out / "slurm_jobs.json").read_text())
    assert list(book) == ["torch_ddp__minigooglenet__2x1__b8__synthetic__fp32__r0"]
    assert slurm["job_id"] not in _squeue(local_slurm).split()


def _wait_running(out: Path, env: dict[str, str], timeout: float = 300) -> str:
    """The sweep's first job id, once SLURM runs it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        book = out / "slurm_jobs.json"
        # the book is written whole (an empty one before the first submission returns)
        jobs = list(json.loads(book.read_text()).values()) if book.exists() else []
        if jobs:
            job = jobs[0]["job_id"]
            if f"{job} mgbench:" in _squeue(env) and \
                    any(line.split()[0] == job and line.endswith("RUNNING")
                        for line in _squeue(env).splitlines()):
                return job
        time.sleep(1)
    raise AssertionError(f"no job of the sweep ran within {timeout} s:\n{_squeue(env)}")


@pytest.mark.slurm
@pytest.mark.slow
# SIGINT only: SIGTERM and SIGHUP reach the same handler as bench.run.sweep.Stopped (a
# KeyboardInterrupt carrying the signal's name), which test_reliability.py checks for local
# sweeps; a second cancelled job would add half a minute for the same path
@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["SIGINT"])
def test_stopping_the_waiting_parent_cancels_its_jobs(local_slurm: dict, tmp_path: Path,
                                                      sig: signal.Signals) -> None:
    out = tmp_path / "out"
    cfg = _config(tmp_path, nodes=[2], measure_steps=100000, timeout_s=600)
    proc = subprocess.Popen([sys.executable, str(REPO / "run_bench.py"), "--config", str(cfg),
                             "--out", str(out)], cwd=REPO, env=local_slurm,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job = _wait_running(out, local_slurm)
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, output
    assert f"cancelling 1 jobs: {job}" in output
    assert f"{job} " not in _squeue(local_slurm)  # no job left behind
    rec = _records(out)["torch_ddp__minigooglenet__2x1__b8__synthetic__fp32__r0"]
    assert rec["status"] == "cancelled", rec["reason"]
    assert rec["slurm"]["state"] == "CANCELLED" and rec["slurm"]["job_id"] == job
    assert sig.name in rec["reason"]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.framework("torch")
def test_a_two_node_converge_sweep_reaches_the_digits_target(
        local_slurm: dict, tmp_path: Path, digits_dataset: Path) -> None:
    """Issue 40: time to accuracy across nodes. torch_ddp on the local cluster's two nodes (a
    rank on each, a c10d rendezvous on the first) trains configs/converge-digits.yaml's recipe
    to its target; the record is one run over two nodes, each node's part named."""
    from tests.helpers.sweeps import assert_stopped_at_target, two_node_converge_sweep

    proc, rec = two_node_converge_sweep(tmp_path / "out", digits_dataset, "torch_ddp",
                                        local_slurm)
    stdout = proc.stdout
    assert rec["status"] == "ok", rec["reason"]
    assert rec["num_nodes"] == 2 and sorted(rec["placement"]) == ["rank0:cpu", "rank1:cpu"]
    assert sorted(n["node"] for n in rec["slurm"]["nodes"]) == ["node1", "node2"]
    assert_stopped_at_target(rec, rec["converge"]["target_accuracy"])
    assert "2x1 vcpu" in stdout  # the converge table's devices: nodes x devices
