"""A sweep on SLURM (`cluster.backend: slurm`): every run one job, submitted with sbatch.

The parent submits one job per run (bench/run/slurm_job.py runs inside it: the launch on each
node and the record), keeps the sweep's jobs in `slurm_jobs.json` in the results folder, and
waits: it shows pending / running / done as SLURM reports them (squeue), and when a job has
left the queue it reads the job's end from SLURM (sacct where accounting is on, else
`scontrol show job`). A job that ended without writing its record (SLURM's time limit,
scancel, a node failure, a preemption) gets one here, with SLURM's state and reason; a job
that wrote one gets SLURM's final state added to it. No job is left behind: Ctrl-C, SIGTERM
or SIGHUP of the waiting parent cancel the sweep's jobs that have not ended (scancel), wait
for SLURM to end them and record them as `cancelled`.

The cap on jobs in flight (`cluster.max_jobs`) is SLURM's own: the k-th job submitted waits
(--dependency=afterany) on the (k - max_jobs)-th, so it holds after `--detach` too.
`run_bench.py status DIR` and `--resume` collect the jobs that have ended; --resume then
submits what is missing and does not submit a run whose job is still queued or running.
"""

from __future__ import annotations

import math
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plan.runs import RunSpec
from bench.records.store import read_json, record_path, runs_dir, write_json_atomic
from bench.run.envs import python_for
from bench.run.launch import base_record, finish, now_iso
from bench.run.slurm_job import job_dir, slurm_fields

BOOK = "slurm_jobs.json"
# SLURM's states of a job that has ended, and the record status each becomes when the job
# wrote no record itself
ENDED: dict[str, str] = {
    "COMPLETED": "failed", "FAILED": "failed", "TIMEOUT": "timeout", "DEADLINE": "timeout",
    "CANCELLED": "cancelled", "OUT_OF_MEMORY": "oom", "NODE_FAIL": "failed",
    "BOOT_FAIL": "failed", "PREEMPTED": "failed", "REVOKED": "failed", "SPECIAL_EXIT": "failed",
}
# the job's own allowance beyond the run's timeout_s: its start on every node, the
# environment capture and the record (SLURM counts time limits in minutes)
JOB_OVERHEAD_MIN = 2
CANCEL_WAIT_S = 60.0


class SlurmError(RuntimeError):
    """sbatch, squeue or scancel failed; the message is SLURM's."""


def _run(cmd: list[str], timeout: float = 60) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                              timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{cmd[0]} not found: cluster.backend slurm needs SLURM's commands "
                         "on this machine (tools/local_slurm.sh up starts a local cluster)"
                         ) from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(cmd[:2])} did not answer in {timeout:g} s") from None
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"{' '.join(cmd[:2])}: {msg[-1] if msg else f'exit {proc.returncode}'}")
    return proc.stdout


def time_limit_minutes(timeout_s: float) -> int:
    """The job's --time: the run's timeout in whole minutes, plus the job's own overhead."""
    return math.ceil(timeout_s / 60) + JOB_OVERHEAD_MIN


def sbatch_command(spec: RunSpec, cluster: dict[str, Any], script: Path, out: Path,
                   after: str | None) -> list[str]:
    """sbatch's arguments for one run's job."""
    cmd = ["sbatch", "--parsable", f"--job-name=mgbench:{spec.run_id}",
           f"--nodes={spec.num_nodes}", "--ntasks-per-node=1",
           f"--time={time_limit_minutes(spec.timeout_s)}",
           f"--output={runs_dir(out) / f'{spec.run_id}.slurm-%j.out'}",
           f"--chdir={REPO_ROOT}"]
    if cluster.get("partition"):
        cmd.append(f"--partition={cluster['partition']}")
    if cluster.get("account"):
        cmd.append(f"--account={cluster['account']}")
    if cluster.get("exclusive", True):
        cmd.append("--exclusive")
    gpus = cluster.get("gpus_per_node") or (spec.devices_per_node if spec.device == "gpu"
                                             else None)
    if gpus:
        cmd.append(f"--gres=gpu:{gpus}")
    if after:
        cmd.append(f"--dependency=afterany:{after}")
    return [*cmd, *cluster.get("sbatch_args", []), str(script)]


def batch_script(spec: RunSpec, python: str, out: Path) -> str:
    """The job: the launch on every node (one srun task each), then the record."""
    harness = shlex.quote(sys.executable)
    spec_path = runs_dir(out) / f"{spec.run_id}.spec.json"
    common = (f"--spec {shlex.quote(str(spec_path))} --out {shlex.quote(str(out))} "
              f"--python {shlex.quote(str(python))}")
    return f"""#!/bin/bash
# mgbench run {spec.run_id}: written by bench/run/slurm.py, submitted with sbatch (slurm_jobs.json
# holds the command). Step 1 launches the run on each node, step 2 writes its record.
set -u
export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}
export PYTHONUNBUFFERED=1
srun --nodes={spec.num_nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 \\
    {harness} -m bench.run.slurm_job node {common}
code=$?
exec {harness} -m bench.run.slurm_job finish {common} --srun-exit "$code"
"""


# ---- the book of the sweep's jobs ----

def read_book(out: Path) -> dict[str, dict[str, Any]]:
    book = read_json(out / BOOK)[0]  # bounded; a damaged book is an empty one
    return book if isinstance(book, dict) else {}


def write_book(out: Path, book: dict[str, dict[str, Any]]) -> None:
    write_json_atomic(out / BOOK, book)


def submit(spec: RunSpec, python: str, out: Path, cluster: dict[str, Any],
           after: str | None) -> dict[str, Any]:
    """Write the run's spec and batch script, submit it; its entry for the book."""
    rdir = runs_dir(out)
    rdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(rdir / f"{spec.run_id}.spec.json", spec.to_dict())
    script = rdir / f"{spec.run_id}.sbatch"
    script.write_text(batch_script(spec, python, out))
    cmd = sbatch_command(spec, cluster, script, out, after)
    job_id = _run(cmd).strip().split(";")[0]
    return {"job_id": job_id, "submitted_at": now_iso(), "python": str(python),
            "sbatch": shlex.join(cmd), "collected": False}


# ---- SLURM's view of the jobs ----

def queued(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """The jobs still in the queue (pending, running, completing): id -> (state, reason)."""
    if not job_ids:
        return {}
    # the whole queue, not `squeue -j IDS`: that fails when every id has left slurmctld's
    # memory (MinJobAge after the end), as the jobs of a sweep collected days later have
    out = _run(["squeue", "-h", "-o", "%i|%T|%r"])
    wanted = set(job_ids)
    states = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in wanted and parts[1] not in ENDED:
            states[parts[0]] = (parts[1], parts[2])
    return states


def ended_state(job_id: str) -> dict[str, Any]:
    """How a job ended, from SLURM's accounting (sacct) where it is on, else from the
    controller's record of it (scontrol, kept MinJobAge after the end)."""
    try:
        out = _run(["sacct", "-X", "-n", "-P", "-j", job_id,
                    "-o", "State,ExitCode,Reason,NodeList,Elapsed"])
        # newest last: a cluster whose controller state was reset numbers its jobs from 1
        # again, and its database still holds the old jobs of the same id
        for line in reversed(out.splitlines()):
            state, code, reason, nodes, elapsed = (line.split("|") + [""] * 5)[:5]
            if state:
                return {"state": state.split()[0], "state_detail": state, "exit_code": code,
                        "reason": reason or None, "node_list": nodes, "elapsed": elapsed,
                        "source": "sacct"}
    except SlurmError:
        pass  # accounting storage is off (no slurmdbd): the controller still knows the job
    try:
        fields = dict(
            f.split("=", 1) for f in _run(["scontrol", "show", "job", "-o", job_id]).split()
            if "=" in f)
    except SlurmError as exc:
        return {"state": "UNKNOWN", "reason": str(exc), "source": "none"}
    return {"state": fields.get("JobState", "UNKNOWN"), "exit_code": fields.get("ExitCode"),
            "reason": fields.get("Reason"), "node_list": fields.get("NodeList"),
            "elapsed": fields.get("RunTime"), "source": "scontrol"}


def collect(spec: RunSpec, entry: dict[str, Any], out: Path, env: dict[str, Any],
            why_cancelled: str | None = None) -> dict[str, Any]:
    """The record of a run whose job has ended: the one the job wrote, with SLURM's final
    state added, or one made here from SLURM's state when the job wrote none."""
    job_id = entry["job_id"]
    end = ended_state(job_id)
    path = record_path(out, spec.run_id)
    rec = None
    if path.exists():
        rec = read_json(path)[0]
        rec = rec if isinstance(rec, dict) else None
    if rec is not None and isinstance(rec.get("slurm"), dict) \
            and rec["slurm"].get("job_id") == job_id:
        rec["slurm"].update(state=end["state"], end_reason=end.get("reason"),
                            exit_code=end.get("exit_code"), state_source=end["source"])
        write_json_atomic(path, rec)
        return rec
    status = ENDED.get(end["state"], "failed")
    rec = base_record(spec, env, runs_dir(out) / f"{spec.run_id}.slurm-{job_id}.out")
    rec["python"] = entry.get("python")
    rec["attempt"] = f"job{job_id}"
    try:
        fields = slurm_fields(job_id)
    except (OSError, subprocess.SubprocessError):
        fields = {"job_id": job_id}
    nodes = []
    for node_file in sorted(job_dir(out, spec.run_id, job_id).glob("node*.json")):
        node = read_json(node_file)[0]
        if isinstance(node, dict):
            nodes.append(node)
    rec["slurm"] = {**fields, "node_list": fields.get("node_list") or end.get("node_list"),
                    "state": end["state"], "end_reason": end.get("reason"),
                    "exit_code": end.get("exit_code"), "state_source": end["source"],
                    "nodes": nodes}
    detail = ", ".join(f"{k}={end[k]}" for k in ("reason", "exit_code", "elapsed")
                       if end.get(k) and end[k] != "None")
    reason = f"SLURM job {job_id} ended {end.get('state_detail') or end['state']}"
    reason += f" ({detail})" if detail else ""
    if end["state"] == "COMPLETED":
        reason += " without writing the run's record (see its .slurm-*.out log)"
    if why_cancelled and status == "cancelled":
        reason = f"{why_cancelled}; {reason}"
    return finish(rec, out, status, reason)


# ---- the sweep ----

def run_sweep(todo: list[RunSpec], blocked: dict[str, tuple[str, str]],
              pythons: dict[str, Any], out: Path, env: dict[str, Any],
              cluster: dict[str, Any], detach: bool) -> int:
    """Submit the runs (those blocked get their record here), then wait for them unless
    detach. KeyboardInterrupt (Ctrl-C, or SIGTERM/SIGHUP as bench.cli.Stopped) cancels the
    sweep's jobs that have not ended, records them, and is raised again."""
    from bench.run.launch import record_without_run

    book = read_book(out)
    specs = {s.run_id: s for s in todo}
    waiting = [rid for rid, e in book.items() if rid in specs and not e.get("collected")]
    in_queue = queued([book[r]["job_id"] for r in waiting])
    live = {r for r in waiting if book[r]["job_id"] in in_queue}
    for rid in waiting:  # jobs of an earlier parent that ended meanwhile
        if rid not in live:
            collect(specs[rid], book[rid], out, env)
            book[rid]["collected"] = True
    write_book(out, book)
    chain = [book[r]["job_id"] for r in live]
    cap = int(cluster.get("max_jobs", 8))
    submitted = 0
    try:
        for spec in todo:
            if spec.run_id in live:  # an earlier parent's job, still queued or running
                continue
            if spec.run_id in blocked:
                record_without_run(spec, out, env, *blocked[spec.run_id])
                print(f"[slurm] {spec.run_id}: {blocked[spec.run_id][0]} "
                      f"{blocked[spec.run_id][1]}", flush=True)
                continue
            python = python_for(spec, pythons)
            if isinstance(python, Exception) or python is None:
                record_without_run(spec, out, env, "unavailable",
                                   f"{spec.family} environment: {python}")
                continue
            after = chain[-cap] if len(chain) >= cap else None
            entry = submit(spec, str(python), out, cluster, after)
            book[spec.run_id] = entry
            write_book(out, book)
            chain.append(entry["job_id"])
            live.add(spec.run_id)
            submitted += 1
            print(f"[slurm] submitted {spec.run_id} as job {entry['job_id']}"
                  + (f" (after job {after})" if after else ""), flush=True)
        if detach:
            print(f"[slurm] {submitted} jobs submitted, {len(live)} in flight; the sweep goes "
                  f"on without this process: `run_bench.py status {out}` collects finished "
                  f"jobs, `--resume --out {out}` waits for them and submits what is missing",
                  flush=True)
            return 0
        wait(specs, book, live, out, env, cluster)
    except KeyboardInterrupt as exc:
        # bench.cli.Stopped carries SIGTERM or SIGHUP; a plain KeyboardInterrupt is Ctrl-C
        signame = exc.args[0] if exc.args else "SIGINT"
        cancel(specs, book, live, out, env, f"cancelled by the sweep's parent ({signame})")
        raise
    return 0


def _status(out: Path, run_id: str) -> str | None:
    rec = read_json(record_path(out, run_id))[0]
    return rec.get("status") if isinstance(rec, dict) else None


def wait(specs: dict[str, RunSpec], book: dict[str, dict[str, Any]], live: set[str],
         out: Path, env: dict[str, Any], cluster: dict[str, Any]) -> None:
    """Until every live job has ended: show the queue's changes, collect ended jobs."""
    poll = float(cluster.get("poll_s", 5.0))
    total, done, last = len(live), 0, ""
    t0 = time.monotonic()
    while live:
        states = queued([book[r]["job_id"] for r in live])
        for rid in sorted(live):
            if book[rid]["job_id"] not in states:
                rec = collect(specs[rid], book[rid], out, env)
                book[rid]["collected"] = True
                write_book(out, book)
                live.discard(rid)
                done += 1
                detail = (f"{rec['images_per_sec']:.1f} img/s" if rec["status"] == "ok"
                          else rec["reason"])
                print(f"[slurm] [{done}/{total}] {rid} (job {book[rid]['job_id']}, "
                      f"{(rec.get('slurm') or {}).get('node_list')}): {rec['status']} {detail}",
                      flush=True)
        counts: dict[str, int] = {}
        for state, _ in states.values():
            counts[state] = counts.get(state, 0) + 1
        line = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))
        line = f"{line + ', ' if line else ''}{done}/{total} done"
        if line != last:
            print(f"[slurm] {time.monotonic() - t0:.0f}s: {line}", flush=True)
            last = line
        if live:
            time.sleep(poll)


def cancel(specs: dict[str, RunSpec], book: dict[str, dict[str, Any]], live: set[str],
           out: Path, env: dict[str, Any], why: str) -> None:
    """scancel the live jobs, wait (bounded) until SLURM has ended them, record them."""
    ids = [book[r]["job_id"] for r in live]
    if not ids:
        return
    print(f"[slurm] cancelling {len(ids)} jobs: {' '.join(ids)}", file=sys.stderr, flush=True)
    try:
        _run(["scancel", *ids])
    except SlurmError as exc:
        print(f"[slurm] scancel: {exc}", file=sys.stderr, flush=True)
    deadline = time.monotonic() + CANCEL_WAIT_S
    remaining = set(live)
    while remaining and time.monotonic() < deadline:
        try:
            states = queued([book[r]["job_id"] for r in remaining])
        except SlurmError:
            break
        for rid in list(remaining):
            if book[rid]["job_id"] not in states:
                collect(specs[rid], book[rid], out, env, why)
                book[rid]["collected"] = True
                remaining.discard(rid)
        if remaining:
            time.sleep(1.0)
    write_book(out, book)
    for rid in remaining:
        print(f"[slurm] job {book[rid]['job_id']} ({rid}) had not ended {CANCEL_WAIT_S:g} s "
              "after scancel; `run_bench.py status` records it once it has", file=sys.stderr,
              flush=True)


def status(out: Path, specs: dict[str, RunSpec], env: dict[str, Any]) -> list[tuple[str, ...]]:
    """Collect the sweep's ended jobs; each booked run's (run_id, job_id, state)."""
    book = read_book(out)
    pending = [r for r, e in book.items() if not e.get("collected")]
    states = queued([book[r]["job_id"] for r in pending])
    rows = []
    for rid, entry in book.items():
        job_id = entry["job_id"]
        if job_id in states:
            state, reason = states[job_id]
            rows.append((rid, job_id, state.lower() + (f" ({reason})" if reason and reason
                                                       != "None" else "")))
            continue
        if not entry.get("collected") and rid in specs:
            collect(specs[rid], entry, out, env)
            entry["collected"] = True
        rows.append((rid, job_id, f"recorded: {_status(out, rid) or 'no record'}"))
    write_book(out, book)
    return rows
