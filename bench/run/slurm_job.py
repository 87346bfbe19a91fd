"""Inside a run's SLURM job: the parent-side launch on every node, then the run's record.

A sweep with `cluster.backend: slurm` (bench/run/slurm.py) submits each run as one job whose batch
script runs two steps:

  srun --nodes=N --ntasks-per-node=1 <harness python> -m bench.run.slurm_job node ...
  <harness python> -m bench.run.slurm_job finish ...

`node` (one task per node) does on its node what bench.run.launch does on one machine: it
captures the node's environment, starts the run's command in the family's interpreter (the
runner itself with launcher python, torchrun with a c10d rendezvous on the first node, ...;
bench.run.launch.child_command with this node's NodePlace) through bench.run.guard, samples the
node's telemetry, kills the run's process group at timeout_s, and writes what it saw to
`runs/<run>.job<ID>/node<K>.json` with its log beside it. It exits 1 when its run failed, so
that srun (--kill-on-bad-exit) stops the other nodes instead of leaving them waiting in a
collective; a node stopped that way says so in its file.

`finish` (the batch script's own step, on the first node, after srun) reads the nodes' files
and the result rank 0 wrote, classifies the run exactly as bench.run.launch does, and writes the
record: the run's usual fields, plus `slurm` (job id, node list, partition, submit and start
times, seconds queued, SLURM_* of the job, and each node's environment, exit status and
telemetry). A job SLURM ends before `finish` (time limit, scancel, node failure) has no
record from here: the sweep's parent writes it from SLURM's own accounting (bench/run/slurm.py).

Everything here runs on the cluster's nodes, with the results folder on a filesystem they
share with the node that submitted the sweep.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.plan.runs import RunSpec
from bench.records.store import runs_dir, write_json_atomic
from bench.run import environment
from bench.run.launch import (
    NodePlace,
    Watched,
    base_record,
    child_command,
    child_env,
    complete,
    finish,
    now_iso,
    watch,
    window_telemetry,
)
from bench.run.peak import peak_for
from bench.run.verdict import classify

# ports a job may use on its first node: MASTER_PORT_BASE + 10 x (job id mod MASTER_PORT_SLOTS)
MASTER_PORT_BASE = 20000
MASTER_PORT_SLOTS = 4000
RESULT_WAIT_S = 30.0  # how long a node waits for rank 0's result (another node may write it)
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES",
              "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_CLUSTER_NAME",
              "SLURM_SUBMIT_HOST", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_NTASKS",
              "SLURM_NODEID", "SLURM_PROCID", "SLURMD_NODENAME", "SLURM_STEP_ID",
              "SLURM_STEP_NODELIST", "CUDA_VISIBLE_DEVICES")


def job_dir(results_dir: Path, run_id: str, job_id: str) -> Path:
    """Where a job's nodes leave their files and logs."""
    return runs_dir(results_dir) / f"{run_id}.job{job_id}"


def master_port(job_id: str) -> int:
    """A port for the job on its first node, the same on every node, different for the jobs
    that may share a node (job ids 4000 apart collide; exclusive nodes never share)."""
    return MASTER_PORT_BASE + 10 * (int(re.sub(r"\D", "", job_id) or 0) % MASTER_PORT_SLOTS)


def hostnames(nodelist: str) -> list[str]:
    """SLURM's compressed node list (node[1-2]) expanded by SLURM itself."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, errors="replace", timeout=60, check=True).stdout
    return out.split()


def node_address(name: str) -> str:
    """The node's address: its name where that resolves (a cluster's host names do), else
    the NodeAddr slurm.conf gives it."""
    with contextlib.suppress(OSError):
        socket.getaddrinfo(name, None)
        return name
    out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True,
                         text=True, errors="replace", timeout=60).stdout
    found = re.search(r"\bNodeAddr=(\S+)", out)
    return found.group(1) if found else name


def place_from_slurm() -> NodePlace:
    """This node's place, from the variables srun gives its task."""
    job = os.environ["SLURM_JOB_ID"]
    first = hostnames(os.environ.get("SLURM_STEP_NODELIST") or
                      os.environ["SLURM_JOB_NODELIST"])[0]
    return NodePlace(rank=int(os.environ["SLURM_NODEID"]),
                     count=int(os.environ.get("SLURM_STEP_NUM_NODES") or
                               os.environ["SLURM_JOB_NUM_NODES"]),
                     master_addr=node_address(first), master_port=master_port(job), job_id=job)


class Terminated(Exception):
    """srun (another node failed, or the job was cancelled) sent SIGTERM."""


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


def run_node(spec: RunSpec, python: str, results_dir: Path, job: Path) -> int:
    """Run this node's part of the run under the local launcher's supervisor
    (bench.run.launch.watch); write job/node<K>.json; 1 if it failed."""
    place = place_from_slurm()
    job.mkdir(parents=True, exist_ok=True)
    spec_path = runs_dir(results_dir) / f"{spec.run_id}.spec.json"
    result_path = job / "result.json"
    log_path = job / f"node{place.rank}.log"
    info: dict[str, Any] = {
        "node_rank": place.rank, "node": os.environ.get("SLURMD_NODENAME"),
        "host": socket.gethostname(), "started_at": now_iso(),
        "environment": environment.capture(), "place": vars(place),
        "slurm_env": {k: os.environ.get(k) for k in SLURM_VARS if k in os.environ},
        "returncode": None, "timed_out": False, "terminated": None, "log_path": str(log_path)}
    # one node: the launch a single machine gets (torchrun --standalone, ...)
    cmd = child_command(spec, python, spec_path, result_path, place if place.count > 1 else None)
    env = {**child_env(spec), **place.env()}
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        seen = watch(spec, python, cmd, env, log_path, stop_on=(Terminated,))
    except Terminated as exc:  # between the handler and the watch: nothing was started
        seen = Watched(stopped=str(exc))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if seen.cannot_start:
        info["cannot_start"] = seen.cannot_start
        return _node_done(job, place, info, 1)
    if seen.stopped:
        info["terminated"] = f"{seen.stopped} from srun: another node's part failed or the " \
                             "job ended"
    info["timed_out"] = seen.timed_out
    info["wall_time_s"] = seen.wall_time_s
    info["returncode"] = seen.returncode
    if seen.left_running:
        info["left_running"] = seen.left_running
    # the timed window of rank 0's result, to cut this node's samples to
    part: dict[str, Any] = dict(_wait_for_result(result_path, seen.returncode == 0)) \
        if seen.sampler is not None and seen.samples is not None else {}
    window_telemetry(part, spec, seen, job / f"node{place.rank}.telemetry.csv")
    if "telemetry" in part:
        info["telemetry"] = part["telemetry"]
        info["contended"] = part.get("contended")
    failed = info["timed_out"] or info["terminated"] or info["returncode"] != 0
    return _node_done(job, place, info, 1 if failed else 0)


def _wait_for_result(path: Path, expect: bool) -> dict[str, Any]:
    """The timed window of rank 0's result (it may be another node's to write)."""
    deadline = time.monotonic() + (RESULT_WAIT_S if expect else 0)
    while True:
        with contextlib.suppress(OSError, ValueError):
            result = json.loads(path.read_text())
            return {k: result.get(k) for k in ("window_start", "window_end", "samples")}
        if time.monotonic() >= deadline:
            return {}
        time.sleep(0.5)


def _node_done(job: Path, place: NodePlace, info: dict[str, Any], code: int) -> int:
    info["finished_at"] = now_iso()
    write_json_atomic(job / f"node{place.rank}.json", info)
    return code


# ---- finish: the record ----

def scontrol_job(job_id: str) -> dict[str, str]:
    """The job as slurmctld has it (`scontrol show job -o`), field by field."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                         text=True, errors="replace", timeout=60).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def queued_seconds(fields: dict[str, str]) -> float | None:
    """StartTime - SubmitTime of a job, from SLURM's own fields (local time, same clock)."""
    from datetime import datetime

    try:
        start = datetime.fromisoformat(fields["StartTime"])
        submit = datetime.fromisoformat(fields["SubmitTime"])
    except (KeyError, ValueError):
        return None
    return max(0.0, (start - submit).total_seconds())


def slurm_fields(job_id: str) -> dict[str, Any]:
    """What the record says of the job, read from SLURM."""
    fields = scontrol_job(job_id)
    return {"job_id": job_id, "job_name": fields.get("JobName"),
            "node_list": fields.get("NodeList"), "num_nodes": _int(fields.get("NumNodes")),
            "partition": fields.get("Partition"), "account": fields.get("Account"),
            "submit_time": fields.get("SubmitTime"), "start_time": fields.get("StartTime"),
            "time_limit": fields.get("TimeLimit"), "queued_s": queued_seconds(fields),
            "tres": fields.get("AllocTRES") or fields.get("TRES"),
            "state": None}


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def write_record(spec: RunSpec, python: str, results_dir: Path, job: Path, job_id: str,
                 srun_exit: int) -> dict[str, Any]:
    """Compose the run's record from the nodes' files and rank 0's result."""
    nodes = []
    for k in range(spec.num_nodes):
        path = job / f"node{k}.json"
        try:
            nodes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            nodes.append({"node_rank": k, "missing": f"{path.name} was not written"})
    first = nodes[0]
    env = first.get("environment") or environment.capture()
    log_path = Path(first.get("log_path") or job / "node0.log")
    rec = base_record(spec, env, log_path)
    rec["python"] = python
    rec["attempt"] = f"job{job_id}"
    rec["slurm"] = {**slurm_fields(job_id), "srun_exit": srun_exit, "nodes": nodes}
    rec["wall_time_s"] = max((n.get("wall_time_s") or 0 for n in nodes), default=None)
    codes = [n.get("returncode") for n in nodes]
    failing = next((n for n in nodes if n.get("returncode") not in (0, None)
                    or n.get("missing") or n.get("cannot_start")), None)
    rec["returncode"] = failing.get("returncode") if failing else codes[0]
    telemetry = first.get("telemetry")
    if telemetry:
        rec["telemetry"] = telemetry
        rec["contended"] = any(n.get("contended") for n in nodes)
    if any(n.get("timed_out") for n in nodes):
        return finish(rec, results_dir, "timeout", f"exceeded timeout_s={spec.timeout_s:g} "
                      f"on {_names([n for n in nodes if n.get('timed_out')])}; process group "
                      "killed")
    if failing and failing.get("cannot_start"):
        return finish(rec, results_dir, "unavailable", failing["cannot_start"])
    if failing and failing.get("missing"):
        return finish(rec, results_dir, "failed", f"node {failing['node_rank']}: "
                      f"{failing['missing']} (srun exit {srun_exit})")
    blamed = failing or first
    status, reason = classify(blamed.get("returncode") or 0, job / "result.json",
                              Path(blamed.get("log_path") or log_path), rec, spec)
    if status == "ok" and failing:  # rank 0 reported success, another node did not end well
        status, reason = "failed", (f"node {failing['node_rank']} ({failing.get('node')}) "
                                    f"exited {failing.get('returncode')}")
    if failing and status != "ok" and reason:
        reason = f"node {failing['node_rank']} ({failing.get('node')}): {reason}"
    # the node's measured matmul peak (cached after its first probe), as the local sweep
    # measures this machine's before its runs: MFU in every record, however launched
    peak = peak_for(spec, python, env) if status == "ok" and spec.mode == "benchmark" else None
    return complete(rec, spec, status, reason, results_dir, peak)


def _names(nodes: list[dict[str, Any]]) -> str:
    return ", ".join(str(n.get("node") or n.get("node_rank")) for n in nodes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run.slurm_job")
    p.add_argument("step", choices=("node", "finish"))
    p.add_argument("--spec", required=True, help="the run's spec JSON")
    p.add_argument("--out", required=True, help="the sweep's results folder")
    p.add_argument("--python", required=True, help="the family's interpreter")
    p.add_argument("--srun-exit", type=int, default=0, help="finish: srun's exit status")
    args = p.parse_args(argv)
    spec = RunSpec(**json.loads(Path(args.spec).read_text()))
    out = Path(args.out)
    job_id = os.environ["SLURM_JOB_ID"]
    job = job_dir(out, spec.run_id, job_id)
    if args.step == "node":
        return run_node(spec, args.python, out, job)
    rec = write_record(spec, args.python, out, job, job_id, args.srun_exit)
    detail = (f"{rec['images_per_sec']:.1f} img/s" if rec["status"] == "ok" and
              isinstance(rec.get("images_per_sec"), float) and math.isfinite(
                  rec["images_per_sec"]) else rec["reason"])
    print(f"[mgbench] {spec.run_id}: {rec['status']} {detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
