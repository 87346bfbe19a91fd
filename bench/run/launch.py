"""Run one RunSpec as a child process and turn whatever happens into a record.

The child is `python -m <runner module> --spec <json> --result <json>` in its family's
interpreter, in a new session so that its whole process group can be killed on timeout or
Ctrl-C. The parent waits on the process (no busy loop), then reads the result file the
child wrote; logs are kept for people, never parsed for numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plan.runs import RunSpec
from bench.records import columns
from bench.records.mfu import mfu
from bench.records.placement_check import check_placement
from bench.records.store import (
    SCHEMA_VERSION,
    json_safe,
    record_path,
    runs_dir,
    write_json_atomic,
)
from bench.run.environment import lock_for
from bench.run.guard import cannot_start, guarded
from bench.run.telemetry import Sampler, write_series
from bench.run.telemetry import summarise as summarise_telemetry
from models import get_spec
from runners.allreduce import bus_factor, gradient_bytes, probe_sizes
from runners.math_mode import math_env
from runners.threads import thread_env

KILL_GRACE_S = 5.0
OOM_PATTERNS = re.compile(
    r"ResourceExhaustedError|OOM when allocating|out of memory|MemoryError|"
    r"CUDA_ERROR_OUT_OF_MEMORY|std::bad_alloc",
    re.IGNORECASE,
)
ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*", re.MULTILINE)
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '[\w.]+'")
# What a rank other than 0 says when it fails (runners/common.main); rank 0 writes the result.
RANK_FAILURE = re.compile(r"^\[runner rank (\d+)\] status=(\w+) reason=(.*)$", re.MULTILINE)
CHILD_FIELDS = columns.keys("child")  # the child's result fields copied to the top level


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def child_env(spec: RunSpec) -> dict[str, str]:
    """The child's environment: the repo importable, and only the GPUs the run may use."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # each framework's documented thread settings, never over the user's (runners/threads.py)
    env.update(thread_env(spec.family, spec.runner, spec.launcher, spec.device,
                          spec.devices_per_node, os.environ))
    if spec.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        # CUDA numbers GPUs fastest first by default; NVML (the parent's telemetry) by PCI bus
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = [v for v in visible.split(",") if v] if visible else []
        ids = ids or [str(i) for i in range(spec.devices_per_node)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[: spec.devices_per_node])
    return math_env(spec.precision, spec.device, env)  # fp32 is IEEE, tf32 TF32 (math_mode)


def sampled_gpus(spec: RunSpec, env: dict[str, str]) -> list[int]:
    """The NVML indices of the GPUs the child may use (none for a CPU run)."""
    if spec.device != "gpu":
        return []
    ids = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    return [int(v) for v in ids] if all(v.isdigit() for v in ids) else \
        list(range(spec.devices_per_node))


@dataclass(frozen=True)
class NodePlace:
    """This node's place in a multi-node run (bench/run/slurm_job.py reads it from SLURM): its
    rank among the run's nodes, their count, the first node's address and the port the job
    may use there (and the 9 after it), and the SLURM job."""

    rank: int
    count: int
    master_addr: str
    master_port: int
    job_id: str

    def env(self) -> dict[str, str]:
        """What a runner started once per node reads (runners.common.process_rank, the
        frameworks' own rendezvous settings in the runners)."""
        return {"MGBENCH_PROCESS_RANK": str(self.rank), "MGBENCH_NUM_NODES": str(self.count),
                "MGBENCH_MASTER_ADDR": self.master_addr,
                "MGBENCH_MASTER_PORT": str(self.master_port)}


def child_command(spec: RunSpec, python: str | Path, spec_path: Path, result_path: Path,
                  node: NodePlace | None = None) -> list[str]:
    """The command line that starts a run (on one node of a multi-node run: `node`): the
    runner module itself, or a launcher that starts one process (rank) per device running
    it. Rank 0 writes the result."""
    module = ["-m", spec.module, "--spec", str(spec_path), "--result", str(result_path)]
    if spec.launcher == "python":
        return [str(python), *module]
    if spec.launcher == "torchrun" and node is not None:
        # torchrun's multi-node launch with a c10d rendezvous hosted by the first node's
        # torchrun (is_host: on a real cluster it is inferred from the host name; here every
        # node is one host, so it is said)
        return [str(python), "-m", "torch.distributed.run", f"--nnodes={node.count}",
                f"--nproc-per-node={spec.devices_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={node.master_addr}:{node.master_port}",
                f"--rdzv-id=mgbench-{node.job_id}",
                f"--rdzv-conf=is_host={int(node.rank == 0)}", *module]
    if spec.launcher == "torchrun":
        # --standalone: a local rendezvous on a free port, so sweeps never collide on one
        return [str(python), "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={spec.num_devices}", *module]
    if spec.launcher == "horovodrun" and node is not None:
        # horovodrun's gloo launch with srun's task on each node in place of its ssh
        # (runners/torch/horovod_launch.py): the first node hosts Horovod's RendezvousServer
        # on the job's port + 1; every node starts its own devices_per_node ranks with the
        # environment horovodrun gives each slot
        return [str(python), "-m", "runners.torch.horovod_launch",
                "-np", str(spec.num_devices), "--slots-per-node", str(spec.devices_per_node),
                "--nodes", str(node.count), "--node-rank", str(node.rank),
                "--rendezvous", f"{node.master_addr}:{node.master_port + 1}",
                str(python), *module]
    if spec.launcher == "horovodrun":
        horovodrun = Path(python).parent / "horovodrun"
        return [str(horovodrun), "-np", str(spec.num_devices), "--gloo",
                "-H", f"localhost:{spec.num_devices}", str(python), *module]
    raise ValueError(f"unknown launcher {spec.launcher!r}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left of it."""
    _signal_group(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)
    _signal_group(proc.pid, signal.SIGKILL)  # also what the leader started and left behind
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def base_record(spec: RunSpec, environment: dict[str, Any], log_path: Path) -> dict[str, Any]:
    """The record's fields known before the child runs."""
    rec: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        **{k: getattr(spec, k) for k in columns.keys("spec")},
        "data_label": spec.data_label,
        "status": None, "reason": None, "log_path": str(log_path),
        "environment": {**environment,
                        "lock": lock_for(spec.family, spec.device, spec.python)},
        "started_at": now_iso(), "finished_at": None,
        "returncode": None, "wall_time_s": None,
    }
    rec.update({k: None for k in CHILD_FIELDS})
    rec["placement"] = None
    return rec


def finish(rec: dict[str, Any], results_dir: Path, status: str, reason: str | None) -> dict:
    rec["status"], rec["reason"] = status, reason
    rec["finished_at"] = now_iso()
    rec = json_safe(rec)
    write_json_atomic(record_path(results_dir, rec["run_id"]), rec)
    return rec


def record_without_run(spec: RunSpec, results_dir: Path, environment: dict[str, Any],
                       status: str, reason: str) -> dict[str, Any]:
    """A record for a run that never started (unavailable environment, invalid combination)."""
    rec = base_record(spec, environment, runs_dir(results_dir) / f"{spec.run_id}.log")
    rec["log_path"] = None
    return finish(rec, results_dir, status, reason)


def launch(spec: RunSpec, python: str | Path, results_dir: Path,
           environment: dict[str, Any], peak: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run spec in a child process; write and return its record (with its MFU against peak,
    the device's measured matmul peak, when given). Ctrl-C kills the child."""
    rdir = runs_dir(results_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    spec_path = rdir / f"{spec.run_id}.spec.json"
    # this attempt's own result file: a straggler of an earlier attempt (an orphan of a killed
    # sweep, say) writes to its own and can never be read as this one's
    attempt = secrets.token_hex(4)
    result_path = rdir / f"{spec.run_id}.{attempt}.result.json"
    log_path = rdir / f"{spec.run_id}.log"
    write_json_atomic(spec_path, spec.to_dict())
    result_path.unlink(missing_ok=True)
    rec = base_record(spec, environment, log_path)
    rec["python"] = str(python)
    rec["attempt"] = attempt
    cmd = child_command(spec, python, spec_path, result_path)
    t0 = time.monotonic()
    timed_out = False
    env = child_env(spec)
    sampler = None
    with open(log_path, "wb") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        reason = cannot_start(cmd[0])
        if reason:
            return finish(rec, results_dir, "unavailable",
                          f"cannot start interpreter {python}: {reason}")
        try:
            # through bench.run.guard: the run's process group dies with this process (a kill -9
            # of the harness included), and with its timeout or Ctrl-C as before
            guarded_cmd, watch_fd = guarded(cmd)
            proc = subprocess.Popen(guarded_cmd, cwd=REPO_ROOT, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, pass_fds=(watch_fd,))
        except OSError as exc:
            return finish(rec, results_dir, "unavailable",
                          f"cannot start interpreter {python}: {exc.strerror}")
        try:
            if spec.telemetry:
                try:
                    sampler = Sampler(proc.pid, sampled_gpus(spec, env),
                                      spec.telemetry["interval_s"]).start()
                except Exception as exc:  # telemetry is evidence, never a reason to lose a run
                    rec["telemetry"] = {"note": f"sampler did not start: {_first_line(str(exc))}"}
            proc.wait(timeout=spec.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # Ctrl-C or anything else: no orphans, no half record
            _kill_group(proc)
            if sampler:
                sampler.stop()
            raise
    samples = sampler.stop() if sampler else None
    if _group_alive(proc.pid):  # what the run started and left running (workers, ranks)
        rec["left_running"] = "processes of the run's group outlived it; killed"
        _signal_group(proc.pid, signal.SIGKILL)
    rec["returncode"] = proc.returncode
    rec["wall_time_s"] = round(time.monotonic() - t0, 3)
    if timed_out:
        status, reason = "timeout", f"exceeded timeout_s={spec.timeout_s:g}; process group killed"
    else:
        status, reason = classify(proc.returncode, result_path, log_path, rec, spec)
    if sampler and samples is not None:
        add_telemetry(rec, spec, sampler, samples, rdir / f"{spec.run_id}.telemetry.csv")
    if peak is not None and status == "ok" and spec.mode == "benchmark":
        rec["mfu"] = run_mfu(spec, rec["images_per_sec"], peak)
    return finish(rec, results_dir, status, reason)


def run_mfu(spec: RunSpec, images_per_sec: float, peak: dict[str, Any]) -> dict[str, Any]:
    """The run's model FLOPs utilisation against the machine's best measured peak (peak), and
    against its own environment's probe (peak["own"]), with what each was."""
    try:
        forward = get_spec(spec.model).flops_per_sample
    except KeyError:
        forward = None
    def flops(p: dict[str, Any]) -> float | None:
        return p.get("peak_flops") if p.get("status") == "ok" else None

    def meta(p: dict[str, Any]) -> dict[str, Any]:
        return {k: p.get(k) for k in (
            "status", "reason", "peak_flops", "device_type", "precision", "dtype", "family",
            "framework", "framework_version", "device_name", "n", "measured_at", "cache_path")}

    own = peak.get("own") or peak
    out = mfu(images_per_sec, forward, flops(peak), spec.num_devices,
              shared_device=spec.virtual_devices)
    # against the run's own framework's matmul: how close its kernels get to their own best
    out["mfu_own_peak"] = mfu(images_per_sec, forward, flops(own), spec.num_devices,
                              shared_device=spec.virtual_devices)["mfu"]
    out["peak"], out["own_peak"] = meta(peak), meta(own)
    return out


def add_telemetry(rec: dict[str, Any], spec: RunSpec, sampler: Sampler,
                  samples: list[dict[str, Any]], path: Path) -> None:
    """Cut the samples to the child's timed window: the series to path, a summary to rec."""
    assert spec.telemetry is not None
    start, end = rec.get("window_start"), rec.get("window_end")
    write_series(path, samples, start, end)
    rec["telemetry"] = summarise_telemetry(
        samples, start, end, rec.get("samples"),
        starved_below_pct=spec.telemetry["starved_below_pct"], interval_s=sampler.interval_s,
        nvml_reason=sampler.nvml_reason, sampled_gpus=bool(sampler.handles),
        logical_cpus=sampler.logical_cpus, top_others=sampler.top_others,
        gpu_holders=list(sampler.others.gpu_holders.values()))
    rec["contended"] = rec["telemetry"]["contention"]["contended"]
    rec["telemetry"]["path"] = f"{path.parent.name}/{path.name}"  # within the results folder


def classify(returncode: int, result_path: Path, log_path: Path, rec: dict[str, Any],
             spec: RunSpec) -> tuple[str, str | None]:
    """Decide a finished child's status and one-line reason; copy its result into rec."""
    result: dict[str, Any] | None = None
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
            if not isinstance(result, dict):
                raise ValueError(f"top level is {type(result).__name__}, not an object")
        except (ValueError, OSError) as exc:
            return "failed", f"child wrote an unreadable result ({_first_line(str(exc))})"
    log_tail = _tail(log_path)
    if result is None:
        if returncode == 0:
            return "failed", "child exited 0 without writing a result"
        if returncode == -signal.SIGKILL:
            return "oom", "killed by SIGKILL (most likely the kernel's out-of-memory killer)"
        if OOM_PATTERNS.search(log_tail):
            return "oom", _reason_from_log(log_tail, OOM_PATTERNS)
        missing = MISSING_MODULE.search(log_tail)
        if missing:
            return "unavailable", f"{missing.group(0)} in the interpreter {rec['python']}"
        rank = RANK_FAILURE.search(log_tail)
        if rank and rank.group(2) != "ok":
            return "failed", _first_line(f"rank {rank.group(1)}: {rank.group(3)}")
        return "failed", f"exit {returncode}: {_reason_from_log(log_tail, ERROR_LINE)}"
    for key in CHILD_FIELDS:
        rec[key] = result.get(key)
    rec["result"] = {k: v for k, v in result.items() if k not in CHILD_FIELDS}
    rec["placement"] = result.get("placement")
    rec["environment"]["framework"] = result.get("framework")
    rec["environment"]["devices"] = result.get("devices")
    status = result.get("status", "ok")
    if status != "ok":
        reason = result.get("reason") or _reason_from_log(log_tail, ERROR_LINE)
        return status, _first_line(reason)
    if returncode != 0:
        return "failed", f"exit {returncode} after reporting success: " \
                         f"{_reason_from_log(log_tail, ERROR_LINE)}"
    problems = validate_result(result, spec, rec)
    return ("invalid", "; ".join(problems)) if problems else ("ok", None)


def validate_placement(result: dict[str, Any], num_devices: int,
                       rec: dict[str, Any] | None = None) -> list[str]:
    """What is wrong with a training result's `placement` (bench/records/placement_check.py): N
    distinct devices, as the framework names them, normalised; and each device's share of
    the work where the runner reports what it expects. The check's view goes into `rec`."""
    shown, problems = check_placement(result, num_devices)
    if rec is not None and shown:
        rec["placement_check"] = shown
    return problems


def validate_result(result: dict[str, Any], spec: RunSpec,
                    rec: dict[str, Any] | None = None) -> list[str]:
    """What is wrong with an 'ok' benchmark, equivalence, pipeline or all-reduce result (empty
    when nothing is); the placement check's view goes into `rec` when given."""
    if spec.mode == "equivalence":
        return validate_placement(result, spec.num_devices, rec)
    if spec.mode == "allreduce":
        return validate_allreduce(result, spec)
    if spec.mode not in ("benchmark", "pipeline"):
        return []
    problems = (validate_placement(result, spec.num_devices, rec)
                if spec.mode == "benchmark" else [])
    expected = spec.measure_steps * spec.global_batch_size
    if result.get("samples") != expected:
        problems.append(f"samples {result.get('samples')!r} != measure_steps x global batch "
                        f"= {expected}")
    for key in ("first_loss", "last_loss") if spec.mode == "benchmark" else ():
        v = result.get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            problems.append(f"{key} is {v!r}, not a finite number")
    ips = result.get("images_per_sec")
    if not isinstance(ips, (int, float)) or not math.isfinite(ips) or ips <= 0:
        problems.append(f"images_per_sec is {ips!r}")
    start, end = result.get("window_start"), result.get("window_end")
    if not (isinstance(start, (int, float)) and isinstance(end, (int, float)) and end > start):
        problems.append(f"timed window [{start!r}, {end!r}] is empty or missing")
    return problems


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def validate_allreduce(result: dict[str, Any], spec: RunSpec) -> list[str]:
    """What is wrong with an ok all-reduce probe result (runners/allreduce.py says what it
    holds): a row for every size of the model's probe_sizes, each checked correct, with a
    positive time and nccl-tests' algbw and busbw for the run's device count; the figure at
    the gradient size; and the framework's own word that the collective spanned
    spec.num_devices replicas on as many distinct devices. Images/sec and MFU do not apply."""
    probe = result.get("allreduce")
    if not isinstance(probe, dict):
        return [f"no allreduce section in the result ({type(probe).__name__})"]
    n, problems = spec.num_devices, []
    evidence = probe.get("evidence")
    if not isinstance(evidence, dict):
        return [f"no evidence read back from the framework (evidence={evidence!r})"]
    replicas = evidence.get("replicas")
    if isinstance(replicas, bool) or replicas != n:
        problems.append(f"the framework says the all-reduce spanned {replicas!r} replicas, "
                        f"not the run's {n} ({evidence.get('source') or 'no source given'})")
    devices = evidence.get("devices")
    if not isinstance(devices, list) or len({str(d) for d in devices}) != n \
            or len(devices) != n:
        problems.append(f"evidence devices {devices!r} are not {n} distinct devices")
    rows = probe.get("sizes")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return [*problems, f"no measured sizes (sizes={rows!r})"]
    want = probe_sizes(spec.model)
    got = [r.get("bytes") for r in rows]
    if got != want:
        problems.append(f"sizes {got} are not the probe's sizes for {spec.model}: {want}")
    for row in rows:
        size = row.get("bytes")
        if row.get("correct") is not True:
            problems.append(f"the all-reduce of {size!r} bytes gave a wrong sum "
                            f"(correct={row.get('correct')!r})")
        t, alg, bus = row.get("time_s"), row.get("algbw_gbps"), row.get("busbw_gbps")
        if not all(_positive(v) for v in (t, alg, bus)) or not _positive(size):
            problems.append(f"size {size!r}: time {t!r} s, algbw {alg!r}, busbw {bus!r} GB/s "
                            "are not all positive finite numbers")
            continue
        want_alg = size / t / 1e9
        if not (math.isclose(alg, want_alg, rel_tol=1e-6)
                and math.isclose(bus, want_alg * bus_factor(n), rel_tol=1e-6)):
            problems.append(f"size {size}: algbw {alg:.6g} and busbw {bus:.6g} GB/s are not "
                            f"nccl-tests' for {size} bytes in {t:.6g} s over {n} devices "
                            f"({want_alg:.6g}, {want_alg * bus_factor(n):.6g})")
    top = next((r for r in rows if r.get("bytes") == gradient_bytes(spec.model)), None)
    if top is None or not _positive(probe.get("busbw_gbps")) \
            or probe.get("busbw_gbps") != top.get("busbw_gbps"):
        problems.append(f"busbw_gbps {probe.get('busbw_gbps')!r} is not the row at the "
                        f"gradient size ({gradient_bytes(spec.model)} bytes)")
    return problems


def _tail(path: Path, size: int = 16384) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _reason_from_log(text: str, pattern: re.Pattern[str]) -> str:
    """The last line of the log that matches pattern, else its last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if pattern.search(line):
            return _first_line(line)
    return _first_line(lines[-1]) if lines else "no output"


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."
